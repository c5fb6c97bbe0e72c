"""Prefix reuse across requests: a new request keeps what its cache slot holds of its prompt
and prefills only the rest, in the target and in every drafter's cache.

Multi-turn conversations (each turn's prompt = the previous prompt, its answer and a new user
turn) must get the same answers from one engine kept across turns as from a fresh engine per
turn, while the later turns' prefills feed only the new tokens; engines sharing runners (as in a
bench) must not be fooled by each other's caches; `clear_cache` starts from nothing.
"""

from __future__ import annotations

import pytest
from eagle_fixtures import tiny_head
from test_dvi_lossless import trained_head
from tiny import TinyTokenizer, perturbed, tiny_generic, tiny_model

from specpilot.config import GenerationConfig
from specpilot.drafting import ModelDrafter, NgramDrafter
from specpilot.drafting.eagle import EagleDrafter
from specpilot.drafting.layer_split import LayerSplitDrafter
from specpilot.engine import SpeculativeEngine
from specpilot.models.decoder import DecoderRunner
from specpilot.models.hf_adapter import HFRunner
from specpilot.policies import ConstantPolicy

FIRST = [1, 5, 9, 14, 30, 31, 30]
NEW_TURNS = [[20, 21, 22], [40, 41, 40, 41]]
MAX_NEW = 14
K = 3


@pytest.fixture(scope="module")
def target_model():
    return tiny_model("qwen2", seed=0)  # float32


@pytest.fixture(scope="module")
def draft_model(target_model):
    return perturbed(target_model, 0.3)


def make_engine(kind: str, target_model, draft_model, batch_size: int = 1) -> SpeculativeEngine:
    """A fresh engine with fresh runners (empty caches)."""
    target = DecoderRunner(target_model, batch_size=batch_size)
    if kind == "none":
        drafter = None
    elif kind == "ngram":
        drafter = NgramDrafter()
    elif kind == "model-dynamic":
        drafter = ModelDrafter(DecoderRunner(draft_model, batch_size=batch_size), topk=3, nodes=8)
    elif kind.startswith("model"):
        branches = 3 if kind == "model-tree" else 1
        drafter = ModelDrafter(DecoderRunner(draft_model, batch_size=batch_size), None, branches)
    elif kind == "eagle":
        drafter = EagleDrafter(target, tiny_head(target), depth=3, topk=3, nodes=8)
    else:  # "dvi-shared" / "dvi-own": DVI's layer-split drafter with or without a shared cache
        drafter = LayerSplitDrafter(target, trained_head(target, 2, std=0.02), kind == "dvi-shared")
        target = drafter.target
    return SpeculativeEngine(target, TinyTokenizer(), drafter, ConstantPolicy(K), eos_ids=set())


def converse(engine_for_turn, first=FIRST, new_turns=NEW_TURNS):
    """Results of each turn; turn t's prompt extends turn t − 1's prompt and answer."""
    config = GenerationConfig(max_new_tokens=MAX_NEW)
    prompt, results = list(first), []
    for t in range(len(new_turns) + 1):
        result = engine_for_turn(t).generate(prompt, config)
        results.append(result)
        if t < len(new_turns):
            prompt = prompt + result.token_ids + new_turns[t]
    return results


def counting_runs(runner) -> list[int]:
    """Tokens (rows) fed through `runner.run_batch`, one entry per call."""
    counts: list[int] = []
    run_batch = runner.run_batch

    def counted(rows, slots, **options):
        counts.append(sum(len(row) for row in rows))
        return run_batch(rows, slots, **options)

    runner.run_batch = counted
    return counts


KINDS = [
    "none", "ngram", "model", "model-tree", "model-dynamic", "dvi-shared", "dvi-own", "eagle",
]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_multi_turn_answers_equal_fresh_engines(target_model, draft_model, kind):
    kept = make_engine(kind, target_model, draft_model)
    reused = converse(lambda t: kept)
    fresh = converse(lambda t: make_engine(kind, target_model, draft_model))
    assert [r.token_ids for r in reused] == [r.token_ids for r in fresh]
    assert [r.stats.prefill_tokens for r in fresh] == [
        len(FIRST) - 1,
        len(FIRST) + MAX_NEW + len(NEW_TURNS[0]) - 1,
        len(FIRST) + 2 * MAX_NEW + sum(map(len, NEW_TURNS)) - 1,
    ]
    # later turns feed the end of the last answer and the new turn but its last token
    assert [r.stats.prefill_tokens for r in reused] == [len(FIRST) - 1, *map(len, NEW_TURNS)]
    if kind not in ("none", "ngram"):  # (the tiny model's answers rarely repeat themselves)
        assert sum(r.stats.accepted for r in reused) > 0


@pytest.mark.parametrize("kind", ["model", "dvi-own"])
def test_drafter_cache_is_reused_across_turns(target_model, draft_model, kind):
    """The drafter's own model feeds the second turn's shared prefix only in a fresh engine."""
    kept = make_engine(kind, target_model, draft_model)
    fresh = [make_engine(kind, target_model, draft_model) for _ in range(2)]
    fed = {}
    for name, engines in (("kept", [kept, kept]), ("fresh", fresh)):
        feeds = []

        def engine_for_turn(t, engines=engines, feeds=feeds):
            if t == 1:  # count what the drafter's model is fed during the second turn
                drafter = engines[1].drafter
                feeds.append(counting_runs(drafter.runner if kind == "model" else drafter.shallow))
            return engines[t]

        converse(engine_for_turn, new_turns=NEW_TURNS[:1])
        fed[name] = sum(feeds[0])
    shared = len(FIRST) + MAX_NEW  # the second turn's prompt before its new user turn
    assert fed["fresh"] - fed["kept"] >= shared - (K + 2)


def test_engines_sharing_runners_see_each_others_writes(target_model, draft_model):
    """A bench runs methods back to back on the same runners: each engine must reuse only what
    the cache really holds, not what it fed there last."""
    target = DecoderRunner(target_model)
    draft = DecoderRunner(draft_model)
    plain = SpeculativeEngine(target, TinyTokenizer(), eos_ids=set())
    engines = [
        SpeculativeEngine(
            target, TinyTokenizer(), ModelDrafter(draft), ConstantPolicy(k), eos_ids=set()
        )
        for k in (2, 4)
    ]
    eagle = EagleDrafter(target, tiny_head(target), depth=3, topk=3, nodes=8)
    engines.append(
        SpeculativeEngine(target, TinyTokenizer(), eagle, ConstantPolicy(3), eos_ids=set())
    )
    expected = converse(lambda t: make_engine("none", target_model, draft_model))
    other = [1, 60, 61, 62, 63, 64, 65, 66]
    # after the rivals, only the first token (shared with their prompt) is left to reuse
    prompts = [len(FIRST) + t * MAX_NEW + sum(map(len, NEW_TURNS[:t])) for t in (1, 2)]
    for engine in [plain, *engines]:

        def engine_for_turn(t, engine=engine):
            for rival in [plain, *engines] if t else []:  # the others write between turns
                if rival is not engine:
                    rival.generate(other + [t], GenerationConfig(max_new_tokens=5))
            return engine

        results = converse(engine_for_turn)
        assert [r.token_ids for r in results] == [r.token_ids for r in expected]
        assert [r.stats.prefill_tokens for r in results[1:]] == [n - 2 for n in prompts]


def test_clear_cache_starts_from_nothing(target_model, draft_model):
    engine = make_engine("model", target_model, draft_model)
    first = engine.generate(FIRST, GenerationConfig(max_new_tokens=MAX_NEW))
    repeated = engine.generate(FIRST, GenerationConfig(max_new_tokens=MAX_NEW))
    assert repeated.stats.prefill_tokens == 0
    engine.clear_cache()
    assert engine.drafter.runner.cached.slots[0] == []
    again = engine.generate(FIRST, GenerationConfig(max_new_tokens=MAX_NEW))
    assert again.stats.prefill_tokens == len(FIRST) - 1
    assert again.token_ids == first.token_ids


def test_batch_rows_reuse_their_own_slots(target_model, draft_model):
    """Two conversations decoded as one batch: each row's second turn reuses its own slot."""
    firsts = [FIRST, [1, 7, 60, 61]]
    engine = make_engine("model", target_model, draft_model, batch_size=2)
    config = GenerationConfig(max_new_tokens=MAX_NEW)
    answers = engine.generate_batch(firsts, config)
    seconds = [p + a.token_ids + NEW_TURNS[0] for p, a in zip(firsts, answers, strict=True)]
    again = engine.generate_batch(seconds, config)
    assert [r.stats.prefill_tokens for r in again] == [len(NEW_TURNS[0])] * 2
    fresh = make_engine("model", target_model, draft_model, batch_size=2)
    assert [r.token_ids for r in again] == [
        r.token_ids for r in fresh.generate_batch(seconds, config)
    ]


@pytest.mark.parametrize("arch", ["gpt2", "gemma3"])
def test_hf_backend_multi_turn(arch):
    """The transformers backend reuses its DynamicCache too, sliding-window layers included
    (Gemma 3's window of 4: the new turn extends what the cache holds, so no rollback below
    the last crop is needed)."""
    model = tiny_generic(arch)

    def engine():
        drafter = ModelDrafter(HFRunner(perturbed(model, 0.3)))
        return SpeculativeEngine(
            HFRunner(model), TinyTokenizer(), drafter, ConstantPolicy(K), eos_ids=set()
        )

    kept = engine()
    reused = converse(lambda t: kept)
    fresh = converse(lambda t: engine())
    assert [r.token_ids for r in reused] == [r.token_ids for r in fresh]
    assert [r.stats.prefill_tokens for r in reused] == [len(FIRST) - 1, *map(len, NEW_TURNS)]


def test_hf_windowed_cache_starts_over_below_its_floor():
    """A prompt that leaves the cached sequence before the windowed layers' last crop cannot
    roll back there: the runner starts over instead, and the answer stays exact."""
    model = tiny_generic("gemma3")
    runner = HFRunner(model)
    engine = SpeculativeEngine(runner, TinyTokenizer(), eos_ids=set())
    drafted = SpeculativeEngine(
        runner, TinyTokenizer(), NgramDrafter(), ConstantPolicy(K), eos_ids=set()
    )
    drafted.generate(FIRST + FIRST, GenerationConfig(max_new_tokens=MAX_NEW))
    assert runner.cached.floors[0] > 3, "the n-gram drafts should have been cropped"
    result = engine.generate(FIRST[:3] + [50, 51], GenerationConfig(max_new_tokens=MAX_NEW))
    assert result.stats.prefill_tokens == 4
    alone = SpeculativeEngine(HFRunner(model), TinyTokenizer(), eos_ids=set())
    expected = alone.generate(FIRST[:3] + [50, 51], GenerationConfig(max_new_tokens=MAX_NEW))
    assert result.token_ids == expected.token_ids
