"""Names → drafters and policies, for the CLI, the bench harness and the server.

Adding a method means adding an entry here (and its class elsewhere); the engine never changes.
Options arrive as strings from the command line and are converted to the constructor's field
types, with a clear error for unknown names or options.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from functools import partial
from typing import Any

from specpilot.drafting import ModelDrafter, NgramDrafter
from specpilot.drafting.dynamic_tree import DEFAULT_DEPTH, DEFAULT_NODES, DEFAULT_TOPK
from specpilot.errors import ConfigError
from specpilot.models.vocab import DraftVocabulary
from specpilot.policies import ConstantPolicy, HeuristicPolicy, SvipPolicy
from specpilot.policies.ltd import LtdPolicy
from specpilot.policies.tree_goodput import TreeGoodputPolicy

DRAFT_POLICIES: dict[str, Callable[..., Any]] = {
    "constant": ConstantPolicy,
    "heuristic": HeuristicPolicy,
    "svip": SvipPolicy,
    "ltd": LtdPolicy,
    "tree-goodput": TreeGoodputPolicy,
}

POLICIES = (*DRAFT_POLICIES, "sv", "goodput")
"""Names for --policy: the draft policies, "sv" (constant drafting + SV verification) and
"goodput" (the batch-aware goodput controller, api.make_goodput)."""

DRAFTERS = ("model", "ngram", "dvi", "eagle", "none")
DRAFTER_OPTIONS = {
    "model": {"draft_vocab", "draft_vocab_corpus", "branches", "topk", "nodes"},
    "ngram": {"max_ngram", "min_ngram"},
    "dvi": {
        "adapter",
        "split",
        "draft_vocab",
        "draft_vocab_corpus",
        "share_cache",
        "learn",
        "branches",
    },
    "eagle": {"head", "depth", "topk", "nodes", "lookup"},
    "none": set(),
}
DVI_SPLIT = 2
"""DVI's default split: the target's first 2 layers draft (the DVI paper's split, §4.1)."""


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
            if kind is bool:
                converted[key] = _flag(value)
            else:
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
    if name == "ltd":
        return make_ltd_policy(**options)
    cls = DRAFT_POLICIES[name]
    return cls(**_convert(cls, options))


def make_ltd_policy(
    policies: str | None = None,
    target: str | None = None,
    use: str = "both",
    check_every: int | str = 1,
) -> LtdPolicy:
    """LTD's learned tree policies from `policies` (a `train-ltd --out` folder or its policies/
    folder; default: the ones committed for `target`); `use` both, depth or size; the depth
    policy consulted every `check_every` levels."""
    from specpilot.policies.ltd_net import LtdNets, resolve_policies

    nets = LtdNets.load(resolve_policies(policies, target))
    return LtdPolicy(nets, use, _count(check_every, "check_every"))


def _flag(value: Any) -> bool:
    return value.lower() in ("1", "true", "yes", "on") if isinstance(value, str) else bool(value)


def _count(value: Any, name: str = "branches") -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None


def _vocabulary(model, size, corpus=None) -> DraftVocabulary | None:
    if not size:
        if corpus:
            raise ConfigError(
                "a draft vocabulary corpus needs its size: --draft-vocab N (draft_vocab=N in bench)"
            )
        return None
    return DraftVocabulary.select(int(size), model.tokenizer, model.runner.vocab_size, corpus)


def make_drafter(name: str, draft=None, target=None, **options: Any):
    """A drafter by name: "model" needs the loaded draft model (option `draft_vocab`: score only
    the first N ids), "ngram" none (options `max_ngram`, `min_ngram`), "dvi" the loaded target
    (see make_dvi_drafter), "none" → None."""
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
        vocabulary = _vocabulary(
            draft, options.get("draft_vocab"), options.get("draft_vocab_corpus")
        )
        return ModelDrafter(
            draft.runner,
            vocabulary,
            _count(options.get("branches", 1)),
            _count(options.get("topk", 1), "topk"),
            _count(options.get("nodes", DEFAULT_NODES), "nodes"),
        )
    if name == "dvi":
        learner = None
        if _flag(options.pop("learn", False)):
            from specpilot.drafting.dvi_learning import DviLearner, DviTrainConfig

            # A train-dvi folder's head goes on learning with the settings it was trained with.
            config = DviTrainConfig.of_run(options.get("adapter"))
            learner = partial(DviLearner, config=config)
        return make_dvi_drafter(target, learner=learner, **options)
    if name == "eagle":
        return make_eagle_drafter(target, **options)
    return NgramDrafter(**_convert(NgramDrafter, options))


def make_eagle_drafter(
    target,
    head: str | None = None,
    depth: int | str = DEFAULT_DEPTH,
    topk: int | str = DEFAULT_TOPK,
    nodes: int | str = DEFAULT_NODES,
    lookup: int | str = 0,
):
    """The feature drafter on the loaded `target`: `head` a `train-eagle`/`train-ppow` output
    folder, a head folder or a committed head's name (`ppow`: heads/<target>-ppow; default: the
    head committed for this target); `topk` 1 drafts chains of `depth`,
    else EAGLE-2 trees of `nodes` tokens grown `depth` levels deep from the best `topk`;
    `lookup` > 0 adds a prompt-lookup branch of up to that many tokens."""
    from specpilot.drafting.eagle import EagleDrafter
    from specpilot.drafting.eagle_head import EagleHead, EagleShape, resolve_head

    if target is None or not hasattr(target.runner, "run_batch"):
        raise ConfigError(
            "the eagle drafter reads the target's hidden states: it needs a target served by the "
            "lean decoder backend (Llama/Qwen2 family)"
        )
    folder = resolve_head(head, target.name)
    expected = EagleShape.for_target(target.runner, target.tokenizer)
    return EagleDrafter(
        target.runner,
        EagleHead.load(folder, expected=expected),
        depth=_count(depth, "depth"),
        topk=_count(topk, "topk"),
        nodes=_count(nodes, "nodes"),
        lookup=_count(lookup, "lookup"),
    )


def make_dvi_drafter(
    target,
    adapter: str | None = None,
    split: int | str | None = None,
    draft_vocab: int | str | None = None,
    draft_vocab_corpus: str | None = None,
    share_cache: bool | str | None = None,
    explore_temperature: float = 0.0,
    learner=None,
    branches: int | str = 1,
):
    """DVI's layer-split self-drafter on the loaded `target`: its first `split` layers (default:
    the adapter's split, else 2) and a LoRA head, trained from `adapter` (a folder from
    `train-dvi`) or untrained (B = 0: the early-exit head). `learner`: a DviLearner class (or
    factory taking the head) to learn online while decoding. `branches` > 1 drafts trees;
    `share_cache` defaults to on for chains and off for trees (which cannot share it)."""
    from specpilot.drafting.dvi_head import DraftHead, read_adapter
    from specpilot.drafting.layer_split import LayerSplitDrafter

    if target is None or not hasattr(target.runner, "run_batch"):
        raise ConfigError(
            "the dvi drafter splits the target's layers: it needs a target served by the lean "
            "decoder backend (Llama/Qwen2 family)"
        )
    info = None if adapter is None else read_adapter(adapter)
    if split is None and info is not None:
        split = info.shape.split
    try:
        split = DVI_SPLIT if split is None else int(split)
    except ValueError:
        raise ConfigError(f"dvi split must be an integer layer count, got {split!r}") from None
    vocabulary = _vocabulary(target, draft_vocab, draft_vocab_corpus)
    head = DraftHead(
        target.runner,
        split,
        None if info is None else info.lora,
        token_ids=None if vocabulary is None else vocabulary.token_ids,
    )
    if adapter is not None:
        head.load(adapter)
    branches = _count(branches)
    return LayerSplitDrafter(
        target.runner,
        head,
        share_cache=branches == 1 if share_cache is None else _flag(share_cache),
        explore_temperature=explore_temperature,
        learner=None if learner is None else learner(head),
        branches=branches,
    )
