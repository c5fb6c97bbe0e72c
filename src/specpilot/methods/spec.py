"""MethodSpec: which drafter and policy decode, with their options, validated when made.

One spec comes from CLI flags (cli.common.method_spec), from bench method strings
(`MethodSpec.parse("sd:drafter=eagle,tree_depth=4")`) and from API keywords
(`MethodSpec.of("eagle", tree_depth=4)`); each option has one name everywhere: the CLI flag's,
with underscores. A spec names its drafter (callers that leave it to the target ask
defaults.default_drafter); a spec with no policy runs the default for where it runs
(defaults.default_policy), resolved from the loaded target (`resolved`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from specpilot.errors import ConfigError
from specpilot.methods.defaults import (
    DEFAULT_TARGET,
    default_drafter,
    default_drafter_options,
    default_policy,
)
from specpilot.methods.drafters import DRAFTERS, drafter_entry
from specpilot.methods.options import convert_all
from specpilot.methods.policies import POLICIES, policy_entry
from specpilot.models.backends import runs_on_ggml

ENGINE_METHODS = ("default", "ar", "sd")
"""Method strings a spec parses: `default` (what `generate` runs with no options), `ar` (plain
decoding) and `sd[:drafter=NAME,policy=NAME,<options>]`."""


@dataclass(frozen=True)
class MethodSpec:
    drafter: str
    policy: str | None = None
    """None: defaults.default_policy's choice for the loaded target (see `resolved`)."""
    options: tuple[tuple[str, Any], ...] = ()
    """The drafter's and the policy's options by name, converted to their declared types."""

    def __post_init__(self) -> None:
        given = dict(self.options.items() if isinstance(self.options, Mapping) else self.options)
        given = {key: value for key, value in given.items() if value is not None}
        declared = {o.name: o for o in drafter_entry(self.drafter).options}
        policies = self._policies(given)
        for name in policies:
            for option in policy_entry(name).options:
                declared.setdefault(option.name, option)
        hint = "".join(_takers(name) for name in given if name not in declared)
        converted = convert_all(tuple(declared.values()), given, self._owner(), hint)
        object.__setattr__(self, "options", tuple(sorted(converted.items())))
        if len(policies) == 1 and policy_entry(*policies).check is not None:
            policy_entry(*policies).check(**self.policy_options)

    @classmethod
    def of(cls, drafter: str, policy: str | None = None, **options: Any):
        """A spec from API keywords, e.g. MethodSpec.of("eagle", "constant", tree_depth=4)."""
        return cls(drafter, policy, tuple(options.items()))

    @classmethod
    def parse(cls, text: str, target: str = DEFAULT_TARGET) -> MethodSpec:
        """A spec from a bench method string: `default`, `ar`, or `sd` with `key=value` options
        (`drafter`, `policy` and the options of both); no drafter: `target`'s default."""
        kind, _, rest = text.partition(":")
        if kind not in ENGINE_METHODS:
            raise ConfigError(
                f"unknown method {kind!r} in {text!r}; choose from {', '.join(ENGINE_METHODS)}"
            )
        options = {}
        for item in filter(None, rest.split(",")):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"method {text!r}: options must be key=value, got {item!r}")
            options[key.strip()] = value.strip()
        if kind != "sd" and options:
            raise ConfigError(f"method {kind!r} takes no options, got {text!r}")
        if kind == "ar":
            return cls("none", "constant", (("k", 1),))
        drafter = options.pop("drafter", None) or default_drafter(target)
        return cls(drafter, options.pop("policy", None), options)

    def resolved(
        self,
        dtype: torch.dtype | None,
        batch: int = 1,
        fixed_length: bool = False,
        backend: str = "torch",
    ) -> MethodSpec:
        """This spec with its policy named: the default for a target computing in `dtype` on the
        CPU (None: elsewhere) decoding `batch` sequences on `backend`, with the drafter options
        that default brings (`fixed_length`: a caller's own verify policy fixes the draft length
        too)."""
        if self.policy is not None:
            return self
        fixed = fixed_length or "k" in dict(self.options)
        facts = (self.drafter, fixed, dtype, batch, backend)
        options = {**default_drafter_options(*facts), **dict(self.options)}
        return MethodSpec(self.drafter, default_policy(*facts), tuple(options.items()))

    def option(self, name: str, default: Any = None) -> Any:
        return dict(self.options).get(name, default)

    @property
    def drafter_options(self) -> dict[str, Any]:
        names = {o.name for o in drafter_entry(self.drafter).options}
        return {key: value for key, value in self.options if key in names}

    @property
    def policy_options(self) -> dict[str, Any]:
        drafter = self.drafter_options
        return {key: value for key, value in self.options if key not in drafter}

    @property
    def runs_on_ggml(self) -> bool:
        """Whether it needs only the ggml runner's forwards (models.backends.runs_on_ggml)."""
        return runs_on_ggml(self.drafter, self.policy, dict(self.options))

    @property
    def needs_draft(self) -> bool:
        """Whether it drafts with the separate draft model."""
        return drafter_entry(self.drafter).needs_draft

    def __str__(self) -> str:
        named = {"drafter": self.drafter, "policy": self.policy, **dict(self.options)}
        return "sd:" + ",".join(f"{k}={_text(v)}" for k, v in named.items() if v is not None)

    def _policies(self, given: dict) -> set[str]:
        """The policy, or every default a spec without one may resolve to."""
        if self.policy is not None:
            return {self.policy}
        fixed = "k" in given
        return {
            default_policy(self.drafter, fixed, dtype, batch, backend)
            for dtype in (None, torch.float32, torch.bfloat16)
            for batch in (1, 2)
            for backend in ("torch", "ggml")
        }

    def _owner(self) -> str:
        policy = "the default policy" if self.policy is None else f"policy {self.policy!r}"
        return f"drafter {self.drafter!r} and {policy}"


def _takers(name: str) -> str:
    """Which other drafters and policies take option `name`, for the error refusing it here."""
    takers = [f"drafter {d}" for d, entry in DRAFTERS.items() if _declares(entry, name)]
    takers += [f"policy {p}" for p, entry in POLICIES.items() if _declares(entry, name)]
    return f"; {name!r} belongs to {', '.join(takers)}" if takers else ""


def _declares(entry, name: str) -> bool:
    return any(option.name == name for option in entry.options)


def _text(value: Any) -> str:
    return str(int(value)) if isinstance(value, bool) else str(value)
