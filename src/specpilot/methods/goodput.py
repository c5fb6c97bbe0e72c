"""The goodput controller's parts: its rows' policy, the controller with its prior latency
curve (the cached `specpilot profile` of this target), and SV trimming what was drafted."""

from __future__ import annotations

from pathlib import Path

from specpilot.files import cache_root, file_name
from specpilot.methods.defaults import GOODPUT_MAX_K
from specpilot.methods.sv import sv_verify_policy
from specpilot.models.pair import ModelPair
from specpilot.policies.controller import GoodputController, GoodputPolicy
from specpilot.policies.latency import VerifyLatency
from specpilot.policies.sv import SvVerifyPolicy


def make_goodput(
    models: ModelPair,
    drafter,
    max_k: int | None = None,
    memory: float = 0.95,
    window: int = 9,
    probe_share: float = 0.01,
    latency_profile: str | None = None,
    sv_profile: str | None = None,
    companion: str | None = None,
    plus_one: bool = True,
) -> tuple[GoodputPolicy, GoodputController, SvVerifyPolicy | None]:
    """The goodput controller (policies.controller) and its rows' policy: rows draft up to
    `max_k` (default GOODPUT_MAX_K, or the drafter's own depth if less), remember their
    acceptance with `memory` per step; T(n) is learned over the last `window` steps per size,
    from the prior curve of `latency_profile` (a `specpilot profile` or `profile-sv` JSON;
    default: the SV profile if given, else the cached `specpilot profile` of this target and
    dtype, if any); probes while nothing drafts cost about `probe_share` of throughput. With
    `sv_profile` (and `companion`) SV then trims what was drafted."""
    depth = drafter.default_budget or GOODPUT_MAX_K
    row = GoodputPolicy(max_k=min(depth, GOODPUT_MAX_K) if max_k is None else max_k, memory=memory)
    verify_policy = None
    if sv_profile is not None or companion is not None:
        verify_policy = sv_verify_policy(models, sv_profile, companion, plus_one)
    controller = GoodputController(
        joint=drafter.drafts_jointly,
        verify_prior=_verify_prior(models, latency_profile or sv_profile),
        window=window,
        probe_share=probe_share,
    )
    return row, controller, verify_policy


def profile_cache_path(target: str, dtype, backend: str = "torch") -> Path:
    """Where `specpilot profile` keeps a copy of its last profile of this target, dtype and
    backend: the goodput controller starts from its latency curve. The ggml backend's file is its
    own: its curve is another (steep where bf16 torch's is flat)."""
    name = file_name(target.strip("/"))
    kind = "ggml" if backend == "ggml" else str(dtype).removeprefix("torch.")
    return cache_root() / "profiles" / f"{name}-{kind}.json"


def _verify_prior(models: ModelPair, path: str | None) -> tuple[tuple[float, float], ...]:
    """T_verify points of a profile JSON, or of this target's cached profile (none: ())."""
    runner = models.target.runner
    cached = profile_cache_path(models.target.name, runner.dtype, runner.backend)
    if path is None and not cached.is_file():
        return ()
    return VerifyLatency.from_profile(path or cached).points
