"""The target's features kept on disk (`--feature-cache`): the same numbers as a fresh prefill,
one folder per target identity, damaged entries recomputed, and training that does not change."""

from __future__ import annotations

import dataclasses

import torch
from eagle_fixtures import TinyLoaded, tiny_head, tiny_target
from tiny import cpu_training

from specpilot.drafting.eagle_head import EagleShape
from specpilot.training.eagle.data import Sample
from specpilot.training.eagle.feature_cache import FeatureCache, target_identity
from specpilot.training.eagle.features import sequence_features
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
    # A prefill that must leave the sample in the KV cache neither reads nor writes entries.
    other = Sample("cut", sample.prompt_ids, sample.response_ids[:10])
    sequence_features(runner, other, layers, rows, keep_cache=True, cache=cache)
    assert cache.load(other.token_ids) is None


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
    for a, b in zip(plain.parameters(), cached.parameters(), strict=True):
        assert torch.equal(a, b)
