"""A spec and loaded models → an engine: the one place names become drafters and policies."""

from __future__ import annotations

from specpilot.drafting.base import SharedTargetDrafter
from specpilot.engine import SpeculativeEngine
from specpilot.errors import ConfigError
from specpilot.methods.drafters import make_drafter
from specpilot.methods.policies import make_policy, policy_entry
from specpilot.methods.spec import MethodSpec
from specpilot.models.chat import eos_token_ids
from specpilot.models.pair import ModelPair
from specpilot.policies import VerifyPolicy


def resolved_for(spec: MethodSpec, models: ModelPair, fixed_length: bool = False) -> MethodSpec:
    """`spec` with its policy named for the loaded target: its dtype (on the CPU), batch size and
    backend (MethodSpec.resolved; `fixed_length`: a caller's verify policy fixes the length)."""
    runner = models.target.runner
    on_cpu = runner.device.type == "cpu"
    dtype = runner.dtype if on_cpu else None
    return spec.resolved(dtype, runner.batch_size, fixed_length, runner.backend)


def engine_for(
    spec: MethodSpec, models: ModelPair, verify_policy: VerifyPolicy | None = None
) -> SpeculativeEngine:
    """The engine `spec` describes on `models`; a spec with no policy gets the default for the
    loaded target's dtype and batch size. `verify_policy`: a ready VerifyPolicy (default: verify
    every drafted token), which fixes the draft length like a `k` does."""
    target = models.target
    runner = target.runner
    spec = resolved_for(spec, models, verify_policy is not None)
    if runner.backend == "ggml" and not spec.runs_on_ggml:
        raise ConfigError(
            f"{spec} reads the target's hidden states or torch weights, which the ggml backend "
            "does not expose; load the models on the torch backend (backend 'torch' or 'auto')",
            ("backend",),
        )
    if policy_entry(spec.policy).verifies and verify_policy is not None:
        raise ConfigError(
            f"policy {spec.policy!r} brings its own verify policy; pass no verify_policy"
        )

    def drafts(shaper=None):
        options = spec.drafter_options
        if shaper is not None:  # a tree policy sets the tree's width and depth
            options = shaper.drafter_options(spec.drafter, options)
        return make_drafter(spec.drafter, models, **options)

    parts = make_policy(spec.policy, models, drafts, **spec.policy_options)
    # A drafter may verify through its own view of the target (DVI's shared shallow cache).
    shares_target = isinstance(parts.drafter, SharedTargetDrafter)
    return SpeculativeEngine(
        parts.drafter.verifier(runner) if shares_target else runner,
        target.tokenizer,
        drafter=parts.drafter,
        draft_policy=parts.draft_policy,
        verify_policy=verify_policy if parts.verify_policy is None else parts.verify_policy,
        eos_ids=eos_token_ids(target.tokenizer, target.path),
        planner=parts.planner,
        method=str(spec),
    )
