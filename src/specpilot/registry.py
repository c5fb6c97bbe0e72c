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
from specpilot.models.vocab import DraftVocabulary
from specpilot.policies import ConstantPolicy, HeuristicPolicy, SvipPolicy

DRAFT_POLICIES: dict[str, Callable[..., Any]] = {
    "constant": ConstantPolicy,
    "heuristic": HeuristicPolicy,
    "svip": SvipPolicy,
}

POLICIES = (*DRAFT_POLICIES, "sv")
"""Names for --policy: the draft policies, and "sv" (constant drafting + SV verification)."""

DRAFTERS = ("model", "ngram", "none")
DRAFTER_OPTIONS = {"model": {"draft_vocab"}, "ngram": {"max_ngram", "min_ngram"}, "none": set()}


def _convert(cls, options: dict[str, Any]) -> dict[str, Any]:
    """Cast string option values to the dataclass field types of `cls`."""
    names = (
        {f.name for f in dataclasses.fields(cls) if f.init}
        if dataclasses.is_dataclass(cls)
        else set()
    )
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
            raise ConfigError(
                f"option {key}={value!r} of {cls.__name__} must be a {kind.__name__}"
            ) from None
    return converted


def make_draft_policy(name: str, **options: Any):
    """A fresh draft policy by name, e.g. make_draft_policy("constant", k="4")."""
    if name not in DRAFT_POLICIES:
        raise ConfigError(f"unknown draft policy {name!r}; choose from {', '.join(DRAFT_POLICIES)}")
    cls = DRAFT_POLICIES[name]
    return cls(**_convert(cls, options))


def make_drafter(name: str, draft=None, **options: Any):
    """A drafter by name: "model" needs the loaded draft model (option `draft_vocab`: score only
    the first N ids), "ngram" none (options `max_ngram`, `min_ngram`), "none" → None."""
    if name not in DRAFTERS:
        raise ConfigError(f"unknown drafter {name!r}; choose from {', '.join(DRAFTERS)}")
    unknown = set(options) - DRAFTER_OPTIONS[name]
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(sorted(unknown))} for drafter {name!r}")
    if name == "none":
        return None
    if name == "model":
        if draft is None:
            raise ConfigError("--drafter model needs a draft model (--draft NAME)")
        vocabulary = None
        if options.get("draft_vocab"):
            size = int(options["draft_vocab"])
            vocabulary = DraftVocabulary.first_ids(size, draft.tokenizer, draft.runner.vocab_size)
        return ModelDrafter(draft.runner, vocabulary)
    return NgramDrafter(**_convert(NgramDrafter, options))
