"""The target's features kept on disk (`--feature-cache`): the same numbers as a fresh prefill,
one folder per target identity, damaged entries recomputed, training that does not change, and
held-out answers prefilled once a run."""

from __future__ import annotations

import csv
import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from eagle_fixtures import WORDS, TinyLoaded, tiny_head, tiny_target
from tiny import cpu_training, tiny_tokenizer

from specpilot.drafting.eagle_head import EagleShape
from specpilot.models.decoder import DecoderRunner
from specpilot.training.eagle import features as features_module
from specpilot.training.eagle.data import DataOptions, Sample, collect_samples
from specpilot.training.eagle.feature_cache import FeatureCache, target_identity
from specpilot.training.eagle.features import sequence_features
from specpilot.training.eagle.scoring import evaluate
from specpilot.training.eagle.trainer import EagleTrainConfig, train_eagle
from specpilot.training.ppow import PpowConfig, train_ppow


def _samples(count=8, length=24):
    generator = torch.Generator().manual_seed(0)
    return [
        Sample(f"s{i}", [1, 5, 6], torch.randint(4, 96, (length,), generator=generator).tolist())
        for i in range(count)
    ]


def _assert_same_features(a, b):
    for field in dataclasses.fields(a):
        assert torch.equal(getattr(a, field.name), getattr(b, field.name)), field.name


@cpu_training
def test_cached_features_equal_a_fresh_prefill(tmp_path):
    target = TinyLoaded(tiny_target(torch.float32))
    runner, layers = target.runner, (1, 2)
    rows = runner.lm_head[:80].contiguous()
    cache = FeatureCache(tmp_path, runner, layers)
    sample = _samples(1)[0]
    fresh = sequence_features(runner, sample, layers, rows)
    stored = sequence_features(runner, sample, layers, rows, cache=cache)
    files = list(cache.folder.glob("*.safetensors"))
    assert len(files) == 1
    loaded = sequence_features(runner, sample, layers, rows, cache=cache)
    _assert_same_features(fresh, stored)
    _assert_same_features(fresh, loaded)
    # A torn or foreign file is recomputed and replaced, not trusted.
    files[0].write_bytes(b"not a safetensors file")
    _assert_same_features(fresh, sequence_features(runner, sample, layers, rows, cache=cache))
    assert cache.load(sample.token_ids) is not None


@cpu_training
def test_a_stored_kv_cache_continues_a_prefix_as_its_own_prefill(tmp_path):
    """PPOW's rollouts: the whole sequence's KV cache is stored once, then loaded and cut at a
    prefix; the target's forward continuing from it matches a prefill of the prefix alone."""
    runner, layers = TinyLoaded(tiny_target(torch.float32)).runner, (1, 2)
    rows = runner.lm_head[:80].contiguous()
    cache = FeatureCache(tmp_path, runner, layers)
    sample, length, window = _samples(1)[0], 12, [7, 8, 9]

    def prefix_and_continuation(use_cache):
        feats = sequence_features(runner, sample, layers, rows, True, use_cache, length)
        assert runner.length == length
        return feats, runner.run(window, logits="all").logits

    fresh, expected = prefix_and_continuation(None)
    stored, after_store = prefix_and_continuation(cache)  # prefills the whole sample, keeps it
    assert len(list(cache.folder.glob("*.kv.safetensors"))) == 1
    loaded, after_load = prefix_and_continuation(cache)
    assert torch.equal(after_store, after_load)  # exactly the stored numbers
    _assert_same_features(stored, loaded)
    # The prefix cut from a longer forward: the same values up to that forward's rounding.
    assert torch.allclose(after_load, expected, atol=1e-5)
    for field in dataclasses.fields(fresh):
        assert torch.allclose(
            getattr(fresh, field.name).float(), getattr(loaded, field.name).float(), atol=1e-5
        )
    # A torn KV file is recomputed and replaced.
    next(cache.folder.glob("*.kv.safetensors")).write_bytes(b"torn")
    assert torch.equal(prefix_and_continuation(cache)[1], after_load)
    assert cache.load_kv(sample.token_ids) is not None
    # A state of another shape is refused, not loaded.
    keys, values = runner.cache_state(0, length)
    with pytest.raises(ValueError, match="does not fit"):
        runner.load_cache_state(0, keys[:1], values[:1])


def test_each_target_identity_has_its_own_folder(tmp_path):
    runner = TinyLoaded(tiny_target(torch.float32)).runner
    same = TinyLoaded(tiny_target(torch.float32)).runner
    names = {
        target_identity(runner, (1, 2)),
        target_identity(runner, (1, 3)),
        target_identity(TinyLoaded(tiny_target(torch.float64)).runner, (1, 2)),
        target_identity(TinyLoaded(tiny_target(torch.float32, seed=1)).runner, (1, 2)),
    }
    assert len(names) == 4
    assert target_identity(same, (1, 2)) == target_identity(runner, (1, 2))


@cpu_training
def test_training_with_the_cache_is_training_without_it(tmp_path):
    target = TinyLoaded(tiny_target(torch.float32))
    samples = _samples(12, 20)
    shape = EagleShape.for_target(target.runner, target.tokenizer)
    config = EagleTrainConfig(
        epochs=2, lr=3e-3, warmup=1, batch_tokens=32, valid_samples=2, eval_every=4, save_every=3
    )
    plain = train_eagle(target, samples, tmp_path / "plain", config, shape, progress=False)
    cached = train_eagle(
        target, samples, tmp_path / "cached", config, shape, progress=False,
        feature_cache=tmp_path / "features",
    )  # fmt: skip
    for a, b in zip(plain.parameters(), cached.parameters(), strict=True):
        assert torch.equal(a, b)
    assert len(list((tmp_path / "features").glob("*/*.safetensors"))) == len(samples)

    init = tiny_head(target.runner, draft_vocab=80, noise=0.3)
    ppow = PpowConfig(
        updates=3, windows_per_update=2, window=4, group=4, gamma=0.12, lr=1e-3,
        valid_samples=2, eval_every=2, save_every=2, adaw_refresh=2, bf16=False,
    )  # fmt: skip
    plain = train_ppow(target, samples, tmp_path / "ppow", ppow, init, progress=False)
    cached = train_ppow(
        target, samples, tmp_path / "ppow_cached", ppow, init, False, tmp_path / "features"
    )
    # Rollouts cut the stored whole-sequence KV cache at their prefixes: the same training up to
    # the rounding of the longer prefill (the same windows sampled, rewards and logged losses;
    # Adam's normalised steps carry the rounding into the weights' last digits).
    for a, b in zip(plain.parameters(), cached.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-4)

    def logged(folder):  # every column but the clock, as numbers
        with (folder / "train_log.csv").open() as log:
            return [
                {
                    key: float(value) if value else None
                    for key, value in row.items()
                    if key != "seconds"
                }
                for row in csv.DictReader(log)
            ]

    # The logs agree to their printed digits but the last (the AVX-512-bf16 EPYC rounded one
    # held-out overlap 0.35676 against 0.35677).
    for row, cached_row in zip(
        logged(tmp_path / "ppow"), logged(tmp_path / "ppow_cached"), strict=True
    ):
        # Empty cells (None) must be empty in both; pytest.approx (9.2) refuses None.
        assert [k for k, v in row.items() if v is None] == [
            k for k, v in cached_row.items() if v is None
        ]
        numbers = {k: v for k, v in row.items() if v is not None}
        assert numbers == pytest.approx({k: cached_row[k] for k in numbers}, rel=1e-4, abs=1e-5)
    assert len(list((tmp_path / "features").glob("*/*.kv.safetensors"))) > 0


@cpu_training
def test_a_run_prefills_its_held_out_answers_once(tmp_path, monkeypatch):
    """Scored every few updates, the held-out answers keep their features in a scratch cache
    where the run has no --feature-cache: the same scores, one prefill each."""
    target = TinyLoaded(tiny_target(torch.float32))
    samples = _samples(10, 20)
    shape = EagleShape.for_target(target.runner, target.tokenizer)
    config = EagleTrainConfig(
        epochs=1, lr=3e-3, warmup=1, batch_tokens=32, valid_samples=2, eval_every=1, save_every=50
    )
    prefilled = []
    fresh_prefill = features_module._prefill

    def counting_prefill(runner, ids, *args):
        prefilled.append(tuple(ids))
        return fresh_prefill(runner, ids, *args)

    monkeypatch.setattr(features_module, "_prefill", counting_prefill)
    train_eagle(target, samples, tmp_path / "run", config, shape, progress=False)
    held_out = [tuple(s.prompt_ids + s.response_ids) for s in samples[-config.valid_samples :]]
    rows = list(csv.DictReader((tmp_path / "run" / "train_log.csv").open()))
    assert sum(1 for row in rows if row["val_acc1"]) >= 3  # scored at least three times
    assert [prefilled.count(ids) for ids in held_out] == [1, 1]

    monkeypatch.setattr(features_module, "_prefill", fresh_prefill)
    head = tiny_head(target.runner, draft_vocab=80, noise=0.3)
    target_rows = target.runner.lm_head[head.draft_ids].contiguous()
    cache = FeatureCache.for_held_out(None, target.runner, head.shape.feature_layers)
    valid = samples[-2:]
    assert evaluate(head, target.runner, valid, head.shape, config, target_rows, cache) == evaluate(
        head, target.runner, valid, head.shape, config, target_rows
    )


@cpu_training
def test_answers_keep_the_features_their_answering_computed(tmp_path, monkeypatch):
    """With a feature cache, the target keeps its features of each answer as it writes it
    (batches of 2, a shared prompt prefix reused across batches): a prefill's taps and hidden
    states up to rounding (float64 here), and training on the answers prefills none of them."""
    rows = [{"question": f"w5 w6 w7 w{8 + i}", "answer": "x"} for i in range(5)]
    (tmp_path / "gsm8k_train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    tokenizer = tiny_tokenizer(WORDS)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}w4 "
    runner = DecoderRunner(tiny_target(torch.float64), max_length=64, batch_size=2)
    target = SimpleNamespace(runner=runner, tokenizer=tokenizer, path=None, name="tiny")
    layers = (1, 2)
    cache = FeatureCache(tmp_path / "features", runner, layers)
    options = DataOptions(
        data_dir=str(tmp_path), sources=("gsm8k_train.jsonl",), max_new_tokens=9, batch_size=2
    )
    samples = collect_samples(
        target, options, 5, 0, tmp_path / "data", 64, progress=False, feature_cache=cache
    )
    trained = [s for s in samples if len(s.response_ids) >= 2]  # what split_samples keeps
    assert len(samples) == 5 and len(trained) >= 3
    for sample in trained:
        stored = cache.load(sample.token_ids)
        assert stored is not None, sample.id
        prefilled = features_module._prefill(runner, sample.token_ids, layers, False)
        for kept, fresh in zip(stored, prefilled, strict=True):
            assert kept.shape == fresh.shape
            assert torch.allclose(kept, fresh, rtol=0, atol=1e-10)

    def no_prefill(*args):
        raise AssertionError("an answer was prefilled again")

    monkeypatch.setattr(features_module, "_prefill", no_prefill)
    shape = EagleShape.for_target(runner, tokenizer, layers)
    config = EagleTrainConfig(epochs=1, batch_tokens=16, valid_samples=1, eval_every=1)
    train_eagle(
        target, trained, tmp_path / "run", config, shape, progress=False,
        feature_cache=tmp_path / "features",
    )  # fmt: skip
