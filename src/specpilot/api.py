"""The small Python API: load a target/draft pair and build an engine by names."""

from __future__ import annotations

from dataclasses import dataclass

from specpilot.engine import SpeculativeEngine
from specpilot.models import LoadedModel, check_same_tokenizer, load_model
from specpilot.models.chat import eos_token_ids
from specpilot.policies import ConstantPolicy, DraftPolicy
from specpilot.registry import make_draft_policy, make_drafter

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
DEFAULT_K = ConstantPolicy().k


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
) -> ModelPair:
    """Load target (and draft) and check that they share one tokenizer."""
    target_model = load_model(target, dtype=dtype, device=device, max_length=max_length)
    draft_model = None
    if draft is not None:
        draft_model = load_model(draft, dtype=dtype, device=device, max_length=max_length)
        check_same_tokenizer(target_model, draft_model)
    return ModelPair(target_model, draft_model)


def build_engine(
    models: ModelPair,
    drafter: str = "model",
    policy: str | DraftPolicy = "constant",
    drafter_options: dict | None = None,
    **policy_options,
) -> SpeculativeEngine:
    """An engine from names: drafter in {model, ngram, none} (with `drafter_options`, see
    registry.make_drafter); policy a name in registry.DRAFT_POLICIES (with its options) or a
    ready DraftPolicy."""
    target = models.target
    if isinstance(policy, str):
        policy = make_draft_policy(policy, **policy_options)
    return SpeculativeEngine(
        target.runner,
        target.tokenizer,
        drafter=make_drafter(drafter, models.draft, **(drafter_options or {})),
        draft_policy=policy,
        eos_ids=eos_token_ids(target.tokenizer, target.path),
    )
