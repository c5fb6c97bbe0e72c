"""The small Python API: load a target/draft pair and build an engine from a method spec."""

from __future__ import annotations

from typing import Any

from specpilot.engine import SpeculativeEngine
from specpilot.errors import ConfigError
from specpilot.methods import MethodSpec, engine_for
from specpilot.methods.defaults import DEFAULT_DRAFT, DEFAULT_TARGET, default_drafter
from specpilot.methods.drafters import drafter_entry
from specpilot.models import check_same_tokenizer, load_model
from specpilot.models.pair import ModelPair
from specpilot.policies import VerifyPolicy

__all__ = ["ModelPair", "build_engine", "load_models"]


AUTO_DRAFT = "auto"
"""load_models' draft: DEFAULT_DRAFT where the target's default drafter needs a draft model."""


def load_models(
    target: str = DEFAULT_TARGET,
    draft: str | None = AUTO_DRAFT,
    dtype: str = "auto",
    device: str = "cpu",
    max_length: int | None = 4096,
    batch_size: int = 1,
    backend: str = "auto",
) -> ModelPair:
    """Load target (and draft) and check that they share one tokenizer (`draft`: a model, None,
    or AUTO_DRAFT: the default draft only where the target has no eagle head, so that its default
    drafter is the draft model; `batch_size`: how many prompts
    `SpeculativeEngine.generate_batch` may decode together; `backend`: see
    models.loading.load_model)."""
    if draft == AUTO_DRAFT:
        draft = DEFAULT_DRAFT if drafter_entry(default_drafter(target)).needs_draft else None
    options = dict(
        dtype=dtype, device=device, max_length=max_length, batch_size=batch_size, backend=backend
    )
    target_model = load_model(target, **options)
    draft_model = None
    if draft is not None:
        draft_model = load_model(draft, **options)
        check_same_tokenizer(target_model, draft_model)
    return ModelPair(target_model, draft_model)


def build_engine(
    models: ModelPair,
    drafter: str | MethodSpec | None = None,
    policy: str | None = None,
    verify_policy: VerifyPolicy | None = None,
    **options: Any,
) -> SpeculativeEngine:
    """An engine on `models` from a MethodSpec, or from names: a drafter of methods.DRAFTERS and
    a policy of methods.POLICIES (None: the default for the loaded target), with the options of
    both by their CLI flag's name (`build_engine(models, "eagle", tree_depth=4)`; no drafter:
    the target's default, methods.defaults.default_drafter);
    `verify_policy` a ready VerifyPolicy (default: verify every drafted token)."""
    if isinstance(drafter, MethodSpec):
        if policy is not None or options:
            raise ConfigError("a MethodSpec carries its policy and options; pass them in it")
        spec = drafter
    else:
        spec = MethodSpec.of(drafter or default_drafter(models.target.name), policy, **options)
    return engine_for(spec, models, verify_policy)
