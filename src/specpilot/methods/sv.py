"""SV's verification half (a goodput-optimal verified prefix) and the companion it reads."""

from __future__ import annotations

from specpilot.errors import ConfigError
from specpilot.models import check_same_tokenizer, load_model
from specpilot.models.backends import choose_backend
from specpilot.models.pair import ModelPair
from specpilot.models.runner import CausalRunner
from specpilot.policies.sv import SvVerifyPolicy, read_sv_profile


def sv_verify_policy(
    models: ModelPair, sv_profile: str | None, companion: str | None, plus_one: bool = True
) -> SvVerifyPolicy:
    """SV's verification half; the companion defaults to the one the profile was made with
    (the table is only valid for it)."""
    profile = read_sv_profile(sv_profile)
    profiled = profile.get("companion")
    companion = companion or profiled
    if companion is None:
        raise ConfigError(
            f"{sv_profile!r} names no companion; name one (a model or early-exit:target:N)",
            ("companion",),
        )
    if profiled is not None and companion != profiled:
        raise ConfigError(
            f"{sv_profile!r} was profiled with companion {profiled!r}, not {companion!r}; "
            "profile again with `specpilot profile-sv --companion ...`"
        )
    backend = models.target.runner.backend
    profiled_on = profile.get("backend", "torch")  # profiles older than the key: torch
    if (profiled_on == "ggml") != (backend == "ggml"):
        raise ConfigError(
            f"{sv_profile!r} was profiled on the {profiled_on} backend, whose verify costs are "
            f"not the {backend} backend's; profile again with `specpilot profile-sv --backend "
            f"{backend}`",
            ("sv_profile",),
        )
    return SvVerifyPolicy.from_profile(
        sv_profile, load_companion(companion, models), plus_one=plus_one
    )


def load_companion(spec: str, models: ModelPair) -> CausalRunner:
    """`early-exit:target:N` / `early-exit:draft:N` (the first N layers of that model, then its
    final norm and LM head: on torch a view of its weights, on ggml a GGUF of their own), or any
    loadable model sharing the tokenizer (on ggml beside a ggml target when it is a GGUF)."""
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
                f"companion {spec!r} needs a loaded {role} on the torch or ggml backend"
            )
        try:
            return model.runner.early_exit(int(parts[2]))
        except ValueError as error:
            raise ConfigError(f"companion {spec!r}: {error}") from None
    runner = target.runner
    on_ggml = runner.backend == "ggml"
    loaded = load_model(
        spec,
        dtype=runner.torch_dtype if on_ggml else runner.dtype,
        device=runner.device,
        max_length=runner.max_length,
        backend=choose_backend("auto", spec, str(runner.device), on_ggml),
        batch_size=runner.batch_size,
    )
    check_same_tokenizer(target, loaded)
    return loaded.runner
