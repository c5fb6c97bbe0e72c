"""Declared method options: a name, a type and a conversion from the strings that CLI flags and
bench method strings carry, with one clear error when a value does not fit."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specpilot.errors import ConfigError

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class Option:
    name: str
    kind: type
    """int, float, bool or str."""

    def __post_init__(self) -> None:
        if self.kind not in (int, float, bool, str):
            raise TypeError(f"option {self.name}: unsupported type {self.kind!r}")

    def convert(self, value: Any, owner: str) -> Any:
        """`value` (a string from the command line, or a Python value) as this option's type."""
        if isinstance(value, str):
            text = value.strip()
            if self.kind is str:
                return text
            if self.kind is bool:
                if text.lower() in TRUE + FALSE:
                    return text.lower() in TRUE
            else:
                try:
                    return self.kind(text)
                except ValueError:
                    pass
        elif self.kind is bool and isinstance(value, bool):
            return value
        elif self.kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        elif self.kind is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(
            f"option {self.name}={value!r} of {owner} must be {_article(self.kind)}"
        ) from None


def _article(kind: type) -> str:
    return {int: "an integer", float: "a number", bool: "a boolean (1/0, true/false)"}.get(
        kind, "a string"
    )


def fields_of(cls: type) -> tuple[Option, ...]:
    """The options of a dataclass: its constructor's fields, with their declared types."""
    hints = typing.get_type_hints(cls)
    return tuple(Option(f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.init)


def keywords_of(builder: Callable[..., Any], context: int = 1) -> tuple[Option, ...]:
    """The options of a builder: its parameters after the first `context` ones (the models...),
    with their declared types (`int | None` → int: None means "not given")."""
    hints = typing.get_type_hints(builder)
    names = list(inspect.signature(builder).parameters)[context:]
    return tuple(Option(name, _declared(hints[name])) for name in names)


def _declared(hint: Any) -> type:
    return next(arg for arg in typing.get_args(hint) or (hint,) if arg is not type(None))


def convert_all(
    declared: tuple[Option, ...], given: dict[str, Any], owner: str, hint: str = ""
) -> dict[str, Any]:
    """`given` converted to the `declared` types; an unknown name is an error naming the rest
    (and ending with `hint`: where the name belongs instead)."""
    by_name = {option.name: option for option in declared}
    unknown = sorted(set(given) - set(by_name))
    if unknown:
        allowed = ", ".join(by_name) or "none"
        plural = "s" if len(unknown) > 1 else ""
        names = ", ".join(map(repr, unknown))
        raise ConfigError(f"unknown option{plural} {names} for {owner} (options: {allowed}){hint}")
    return {key: by_name[key].convert(value, owner) for key, value in given.items()}
