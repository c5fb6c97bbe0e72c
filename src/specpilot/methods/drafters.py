"""The drafter table: every drafter by name, its declared options and its builder.

Each builder takes the loaded models and the drafter's options, already converted to their
declared types, by the names the CLI flags have (`--eagle-head` → `eagle_head`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specpilot.drafting import ModelDrafter, NgramDrafter
from specpilot.errors import ConfigError
from specpilot.methods.defaults import DEFAULT_DEPTH, DEFAULT_NODES, DEFAULT_TOPK, DVI_SPLIT
from specpilot.methods.options import Option, convert_all, fields_of, keywords_of
from specpilot.models.pair import ModelPair
from specpilot.models.vocab import DraftVocabulary


@dataclass(frozen=True)
class DrafterEntry:
    name: str
    options: tuple[Option, ...]
    build: Callable[..., Any]
    """build(models, **options) → the drafter (None: plain decoding)."""
    needs_draft: bool = False
    """Whether it drafts with the separate draft model (`--draft`)."""


def make_drafter(name: str, models: ModelPair, **options: Any):
    """The drafter `name` on the loaded `models`, its options given as values or strings."""
    entry = drafter_entry(name)
    return entry.build(models, **convert_all(entry.options, options, f"drafter {name!r}"))


def drafter_entry(name: str) -> DrafterEntry:
    if name not in DRAFTERS:
        raise ConfigError(f"unknown drafter {name!r}; choose from {', '.join(DRAFTERS)}")
    return DRAFTERS[name]


def _vocabulary(model, size: int | None, corpus: str | None) -> DraftVocabulary | None:
    if not size:
        if corpus:
            raise ConfigError("a draft vocabulary corpus needs its size: draft_vocab=N")
        return None
    return DraftVocabulary.select(size, model.tokenizer, model.runner.vocab_size, corpus)


def _lean_target(models: ModelPair, why: str):
    target = None if models is None else models.target
    if target is None or getattr(target.runner, "backend", None) != "torch":
        raise ConfigError(
            f"the {why}: it needs a target served by the lean decoder backend (Llama/Qwen2 family)"
        )
    return target


def model_drafter(
    models: ModelPair,
    draft_vocab: int | None = None,
    draft_vocab_corpus: str | None = None,
    branches: int = 1,
    tree_topk: int = 1,
    tree_nodes: int = DEFAULT_NODES,
) -> ModelDrafter:
    """The separate draft model: chains, the top `branches` first tokens, or (`tree_topk` > 1)
    EAGLE-2 trees of `tree_nodes` tokens; `draft_vocab` N scores only the first N ids (or the N
    most frequent in `draft_vocab_corpus`)."""
    if models.draft is None:
        raise ConfigError(
            "the model drafter needs a draft model: pass --draft NAME, or draft=NAME to "
            "load_models (the default draft loads only for targets without an eagle head)"
        )
    vocabulary = _vocabulary(models.draft, draft_vocab, draft_vocab_corpus)
    return ModelDrafter(models.draft.runner, vocabulary, branches, tree_topk, tree_nodes)


def eagle_drafter(
    models: ModelPair,
    eagle_head: str | None = None,
    tree_depth: int = DEFAULT_DEPTH,
    tree_topk: int = DEFAULT_TOPK,
    tree_nodes: int = DEFAULT_NODES,
    eagle_lookup: int = 0,
):
    """The feature drafter on the loaded target: `eagle_head` a `train-eagle`/`train-ppow` output
    folder, a head folder or a committed head's name (`ppow`: heads/<target>-ppow; default: the
    head committed for this target); `tree_topk` 1 drafts chains of `tree_depth`, else EAGLE-2
    trees of `tree_nodes` tokens grown `tree_depth` levels deep from the best `tree_topk`;
    `eagle_lookup` > 0 adds a prompt-lookup branch of up to that many tokens."""
    from specpilot.drafting.eagle import EagleDrafter
    from specpilot.drafting.eagle_head import EagleHead, EagleShape, resolve_head
    from specpilot.drafting.eagle_inputs import HeadInputs

    target = models.target
    runner = target.runner
    if runner.backend == "ggml":  # the head's inputs from the GGUF, its shape from the config
        config = target.config
        bias = getattr(config, "attention_bias", config.model_type == "qwen2")
        expected = EagleShape.for_config(config, runner.vocab_size, target.tokenizer, bias)
        inputs = HeadInputs.of_gguf(runner, config)
    else:
        target = _lean_target(models, "eagle drafter reads the target's hidden states")
        expected, inputs = EagleShape.for_target(runner, target.tokenizer), None
    head = EagleHead.load(resolve_head(eagle_head, target.name), expected=expected)
    return EagleDrafter(
        runner,
        head,
        depth=tree_depth,
        topk=tree_topk,
        nodes=tree_nodes,
        lookup=eagle_lookup,
        inputs=inputs,
    )


def dvi_drafter(
    models: ModelPair,
    dvi_adapter: str | None = None,
    dvi_split: int | None = None,
    draft_vocab: int | None = None,
    draft_vocab_corpus: str | None = None,
    share_cache: bool | None = None,
    learn: bool = False,
    branches: int = 1,
):
    """DVI's layer-split self-drafter on the loaded target: its first `dvi_split` layers
    (default: the adapter's split, else DVI_SPLIT) and a LoRA head, trained from `dvi_adapter` (a
    folder from `train-dvi`) or untrained (B = 0: the early-exit head); `learn` trains it online
    while decoding, with the settings of the `train-dvi` run it came from. `branches` > 1 drafts
    trees; `share_cache` defaults to on for chains and off for trees (which cannot share it)."""
    from specpilot.drafting.dvi_head import DraftHead, read_adapter
    from specpilot.drafting.dvi_learning import DviLearner, DviTrainConfig
    from specpilot.drafting.layer_split import LayerSplitDrafter

    target = _lean_target(models, "dvi drafter splits the target's layers")
    info = None if dvi_adapter is None else read_adapter(dvi_adapter)
    if dvi_split is None:
        dvi_split = DVI_SPLIT if info is None else info.shape.split
    vocabulary = _vocabulary(target, draft_vocab, draft_vocab_corpus)
    head = DraftHead(
        target.runner,
        dvi_split,
        None if info is None else info.lora,
        token_ids=None if vocabulary is None else vocabulary.token_ids,
    )
    if dvi_adapter is not None:
        head.load(dvi_adapter)
    learner = None
    if learn:  # a train-dvi folder's head goes on learning with the settings it was trained with
        learner = DviLearner(head, config=DviTrainConfig.of_run(dvi_adapter))
    return LayerSplitDrafter(
        target.runner,
        head,
        share_cache=branches == 1 if share_cache is None else share_cache,
        learner=learner,
        branches=branches,
    )


DRAFTERS: dict[str, DrafterEntry] = {
    entry.name: entry
    for entry in (
        DrafterEntry("model", keywords_of(model_drafter), model_drafter, needs_draft=True),
        DrafterEntry("ngram", fields_of(NgramDrafter), lambda models, **o: NgramDrafter(**o)),
        DrafterEntry("dvi", keywords_of(dvi_drafter), dvi_drafter),
        DrafterEntry("eagle", keywords_of(eagle_drafter), eagle_drafter),
        DrafterEntry("none", (), lambda models: None),
    )
}
"""Every drafter; `none` is plain decoding."""
