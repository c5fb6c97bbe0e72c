"""The small Python API: load a target/draft pair and build an engine by names."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.engine import SpeculativeEngine
from specpilot.errors import ConfigError
from specpilot.models import LoadedModel, check_same_tokenizer, load_model
from specpilot.models.chat import eos_token_ids
from specpilot.models.runner import CausalRunner
from specpilot.policies import ConstantPolicy, DraftPolicy, VerifyPolicy
from specpilot.policies.controller import GoodputController, GoodputPolicy
from specpilot.policies.goodput import VerifyLatency
from specpilot.policies.sv import SvVerifyPolicy, read_sv_profile
from specpilot.registry import make_draft_policy, make_drafter

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
DEFAULT_K = ConstantPolicy().k
SV_GAMMA_MAX = 5
"""Tokens SV drafts before choosing how many to verify (the paper uses 5 or 7)."""
GOODPUT_MAX_K = 8
"""The most tokens a row drafts under the goodput controller (a drafter's own depth if less)."""
EAGLE_BF16_LOOKUP = 7
"""The prompt-lookup branch an eagle tree verifies by default (`default_drafter_options`)."""


@dataclass
class ModelPair:
    target: LoadedModel
    draft: LoadedModel | None


def load_models(
    target: str = DEFAULT_TARGET,
    draft: str | None = DEFAULT_DRAFT,
    dtype: str = "auto",
    device: str = "cpu",
    max_length: int | None = 4096,
    batch_size: int = 1,
    backend: str = "auto",
) -> ModelPair:
    """Load target (and draft) and check that they share one tokenizer (`batch_size`: how many
    prompts `SpeculativeEngine.generate_batch` may decode together; `backend`: see
    models.loading.load_model)."""
    options = dict(
        dtype=dtype, device=device, max_length=max_length, batch_size=batch_size, backend=backend
    )
    target_model = load_model(target, **options)
    draft_model = None
    if draft is not None:
        draft_model = load_model(draft, **options)
        check_same_tokenizer(target_model, draft_model)
    return ModelPair(target_model, draft_model)


def default_policy(
    drafter: str,
    fixed_length: bool = False,
    dtype: torch.dtype | None = None,
    batch: int = 1,
) -> str:
    """The policy a method runs when none is named. For the draft model, the goodput controller:
    it drafts only where this machine's measured latency and the rows' acceptance say it pays
    (greedy bf16: within 2 % of the best of plain decoding and constant k at every batch size
    1-32, where constant k lost up to 32 %; BENCHMARKS §10.13). For the eagle tree, decoding one
    sequence at a time with a target computing in float32 on the CPU (`dtype`: the target's, None
    where it is not on the CPU), `tree-goodput`: a float32 verify of the default tree's 9 tokens
    costs ~1.5 plain steps, and the constant 8-node tree ran at 1.04x plain decoding (1.5B) and
    0.79x (SmolLM2) where sizing each step's tree on the measured curve ran at 1.52x and 1.01x
    (BENCHMARKS §8.9, §8.10); it learns a one-sequence curve, so batches keep the constant tree.
    Constant where the caller asks for a `fixed_length` (a `k`, or a verify policy of its own),
    for bf16 eagle trees (measured best constant, §8.7) and for the other drafters, whose default
    depths were measured constant (prompt lookup, DVI) and are not yet measured under the
    controller."""
    if fixed_length:
        return "constant"
    if drafter == "model":
        return "goodput"
    if drafter == "eagle" and dtype == torch.float32 and batch == 1:
        return "tree-goodput"
    return "constant"


def default_drafter_options(
    drafter: str,
    fixed_length: bool = False,
    dtype: torch.dtype | None = None,
    batch: int = 1,
) -> dict[str, int]:
    """The drafter options a method gets when it names no policy (arguments as `default_policy`):
    for the eagle tree decoding one sequence with a target computing in bf16 on the CPU (where
    `default_policy` keeps the constant tree), a prompt-lookup branch of EAGLE_BF16_LOOKUP tokens.
    There verifying its extra nodes is nearly free, and the tree with it ran 1.14x the tree without
    on the Xeon (AMX-bf16, 24 held-out prompts) and 1.25x on the AVX-512-bf16 EPYC (BENCHMARKS
    §8.8, §8.11); in float32 the extra nodes cost more than they save (0.97x plain decoding, §8.9);
    batches, GPUs and a `fixed_length` were not measured with it."""
    if drafter == "eagle" and not fixed_length and dtype == torch.bfloat16 and batch == 1:
        return {"lookup": EAGLE_BF16_LOOKUP}
    return {}


def build_engine(
    models: ModelPair,
    drafter: str = "model",
    policy: str | DraftPolicy | None = None,
    drafter_options: dict | None = None,
    verify_policy: VerifyPolicy | None = None,
    **policy_options,
) -> SpeculativeEngine:
    """An engine from names: drafter in registry.DRAFTERS (with `drafter_options`, see
    registry.make_drafter); policy a name in registry.POLICIES (with its options), a ready
    DraftPolicy, or None for `default_policy`'s choice (under the drafter options,
    `default_drafter_options`'); `verify_policy` a ready VerifyPolicy (default: verify every
    drafted token).
    "sv" drafts a constant gamma_max and verifies SV's chosen prefix (options sv_profile,
    companion, gamma_max, plus_one; see make_sv). "goodput" plans every step's draft lengths
    with the goodput controller (options: see make_goodput)."""
    target = models.target
    if policy is None:
        runner = target.runner
        defaults = (
            drafter,
            "k" in policy_options or verify_policy is not None,
            runner.dtype if runner.device.type == "cpu" else None,
            runner.batch_size,
        )
        policy = default_policy(*defaults)
        drafter_options = {**default_drafter_options(*defaults), **(drafter_options or {})}
    if policy in ("sv", "goodput") and verify_policy is not None:
        raise ConfigError(f"policy {policy!r} brings its own verify policy; pass no verify_policy")
    if policy == "sv":
        policy, verify_policy = make_sv(models, **policy_options)
    if policy == "ltd":  # the committed policies of this target unless a folder is named
        policy = make_draft_policy("ltd", **{"target": target.name, **policy_options})
    shaping = getattr(policy, "drafter_options", None)  # LTD sets the tree's width and depth
    if shaping is not None:
        drafter_options = shaping(drafter, drafter_options or {})
    draft = make_drafter(drafter, models.draft, target, **(drafter_options or {}))
    planner = None
    if policy == "goodput":
        policy, planner, verify_policy = make_goodput(models, draft, **policy_options)
    if isinstance(policy, str):
        # A drafter with a natural draft length (a tree's depth) sets constant k's default.
        default = getattr(draft, "default_budget", None)
        if policy == "constant" and "k" not in policy_options and default:
            policy_options = {**policy_options, "k": default}
        policy = make_draft_policy(policy, **policy_options)
    # A drafter may verify through its own view of the target (DVI's shared shallow cache).
    verifier = getattr(draft, "verifier", None)
    return SpeculativeEngine(
        target.runner if verifier is None else verifier(target.runner),
        target.tokenizer,
        drafter=draft,
        draft_policy=policy,
        verify_policy=verify_policy,
        eos_ids=eos_token_ids(target.tokenizer, target.path),
        planner=planner,
    )


def make_sv(
    models: ModelPair,
    sv_profile: str | None = None,
    companion: str | None = None,
    gamma_max: int | str = SV_GAMMA_MAX,
    plus_one: bool | str = True,
) -> tuple[ConstantPolicy, SvVerifyPolicy]:
    """SV's two halves: draft gamma_max tokens, verify the goodput-optimal prefix."""
    verify_policy = sv_verify_policy(models, sv_profile, companion, plus_one)
    return ConstantPolicy(int(gamma_max)), verify_policy


def sv_verify_policy(
    models: ModelPair, sv_profile: str | None, companion: str | None, plus_one: bool | str = True
) -> SvVerifyPolicy:
    """SV's verification half; the companion defaults to the one the profile was made with
    (the table is only valid for it)."""
    profile = read_sv_profile(sv_profile)
    profiled = profile.get("companion")
    companion = companion or profiled
    if companion is None:
        raise ConfigError(f"{sv_profile!r} names no companion; pass --companion NAME")
    if profiled is not None and companion != profiled:
        raise ConfigError(
            f"{sv_profile!r} was profiled with companion {profiled!r}, not {companion!r}; "
            "profile again with `specpilot profile-sv --companion ...`"
        )
    if isinstance(plus_one, str):
        plus_one = plus_one.lower() in ("1", "true", "yes")
    return SvVerifyPolicy.from_profile(
        sv_profile, load_companion(companion, models), plus_one=plus_one
    )


def make_goodput(
    models: ModelPair,
    draft,
    max_k: int | str | None = None,
    memory: float | str = 0.95,
    window: int | str = 9,
    probe_share: float | str = 0.01,
    latency_profile: str | None = None,
    sv_profile: str | None = None,
    companion: str | None = None,
    plus_one: bool | str = True,
    **unknown,
) -> tuple[GoodputPolicy, GoodputController, SvVerifyPolicy | None]:
    """The goodput controller (policies.controller) and its rows' policy: rows draft up to
    `max_k` (default GOODPUT_MAX_K, or the drafter's own depth if less), remember their
    acceptance with `memory` per step; T(n) is learned over the last `window` steps per size,
    from the prior curve of `latency_profile` (a `specpilot profile` or `profile-sv` JSON;
    default: the SV profile if given, else the cached `specpilot profile` of this target and
    dtype, if any); probes while nothing drafts cost about `probe_share` of throughput. With
    `sv_profile` (and `companion`) SV then trims what was drafted."""
    if unknown:
        raise ConfigError(
            f"unknown goodput option(s) {', '.join(sorted(unknown))} (options: max_k, memory, "
            "window, probe_share, latency_profile, sv_profile, companion, plus_one)"
        )
    try:
        depth = getattr(draft, "default_budget", None) or GOODPUT_MAX_K
        row = GoodputPolicy(
            max_k=int(max_k) if max_k is not None else min(depth, GOODPUT_MAX_K),
            memory=float(memory),
        )
        window, probe_share = int(window), float(probe_share)
    except ValueError as error:
        raise ConfigError(f"goodput option: {error}") from None
    verify_policy = None
    if sv_profile is not None or companion is not None:
        verify_policy = sv_verify_policy(models, sv_profile, companion, plus_one)
    controller = GoodputController(
        joint=getattr(draft, "drafts_jointly", False),
        verify_prior=_verify_prior(models, latency_profile or sv_profile),
        window=window,
        probe_share=probe_share,
    )
    return row, controller, verify_policy


def _verify_prior(models: ModelPair, path: str | None) -> tuple[tuple[float, float], ...]:
    """T_verify points of a profile JSON, or of this target's cached profile (none: ())."""
    from specpilot.bench.profile import profile_cache_path

    runner = models.target.runner
    cached = profile_cache_path(
        models.target.name, runner.dtype, getattr(runner, "backend", "torch")
    )
    if path is None and not cached.is_file():
        return ()
    return VerifyLatency.from_profile(path or cached).points


def load_companion(spec: str, models: ModelPair) -> CausalRunner:
    """`early-exit:target:N` / `early-exit:draft:N` (the first N layers of that model, then its
    final norm and LM head, sharing its weights), or any loadable model sharing the tokenizer."""
    target = models.target
    if spec.startswith("early-exit:"):
        parts = spec.split(":")
        role = parts[1] if len(parts) == 3 else None
        if role not in ("target", "draft") or not parts[2].isdigit():
            raise ConfigError(
                f"companion {spec!r}: expected early-exit:target:N or early-exit:draft:N"
            )
        model = getattr(models, role)
        if model is None or not hasattr(model.runner, "early_exit"):
            raise ConfigError(
                f"companion {spec!r} needs a loaded {role} served by the lean decoder backend"
            )
        try:
            return model.runner.early_exit(int(parts[2]))
        except ValueError as error:
            raise ConfigError(f"companion {spec!r}: {error}") from None
    runner = target.runner
    loaded = load_model(
        spec,
        dtype=runner.dtype,
        device=runner.device,
        max_length=runner.max_length,
        batch_size=runner.batch_size,
    )
    check_same_tokenizer(target, loaded)
    return loaded.runner
