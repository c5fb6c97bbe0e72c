"""Names → drafters and policies, for the CLI, the bench harness and the server.

Adding a method means adding an entry here (and its class elsewhere); the engine never changes.
Options arrive as strings from the command line and are converted to the constructor's field
types, with a clear error for unknown names or options.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

from specpilot.drafting import ModelDrafter, NgramDrafter
from specpilot.errors import ConfigError
from specpilot.policies import ConstantPolicy, HeuristicPolicy

DRAFT_POLICIES: dict[str, Callable[..., Any]] = {
    "constant": ConstantPolicy,
    "heuristic": HeuristicPolicy,
}

DRAFTERS = ("model", "ngram", "none")


def _convert(cls, options: dict[str, Any]) -> dict[str, Any]:
    """Cast string option values to the dataclass field types of `cls`."""
    names = {f.name for f in dataclasses.fields(cls) if f.init} if dataclasses.is_dataclass(cls) else set()
    hints = typing.get_type_hints(cls)
    converted = {}
    for key, value in options.items():
        if key not in names:
            allowed = ", ".join(sorted(names)) or "none"
            raise ConfigError(f"unknown option {key!r} for {cls.__name__} (options: {allowed})")
        kind = hints[key]
        try:
            converted[key] = kind(value) if isinstance(value, str) else value
        except ValueError:
            raise ConfigError(f"option {key}={value!r} of {cls.__name__} must be a {kind.__name__}") from None
    return converted


def make_draft_policy(name: str, **options: Any):
    """A fresh draft policy by name, e.g. make_draft_policy("constant", k="4")."""
    if name not in DRAFT_POLICIES:
        raise ConfigError(f"unknown draft policy {name!r}; choose from {', '.join(DRAFT_POLICIES)}")
    cls = DRAFT_POLICIES[name]
    return cls(**_convert(cls, options))


def make_drafter(name: str, draft=None, **options: Any):
    """A drafter by name: "model" needs the loaded draft model, "ngram" none, "none" → None."""
    if name == "none":
        return None
    if name == "model":
        if draft is None:
            raise ConfigError("--drafter model needs a draft model (--draft NAME)")
        return ModelDrafter(draft.runner)
    if name == "ngram":
        return NgramDrafter(**_convert(NgramDrafter, options))
    raise ConfigError(f"unknown drafter {name!r}; choose from {', '.join(DRAFTERS)}")
