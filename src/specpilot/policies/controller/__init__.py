"""The goodput controller (docs/methods.md §7): per-row draft budgets planned from the whole
batch's forecasts and the machine's learned costs. Its constants are tabled in §7.9."""

from specpilot.policies.controller.acceptance import (
    FINISH_POOLING,
    PRIOR_ACCEPTANCE,
    AcceptanceByPosition,
    BatchAcceptance,
    ConfidenceCalibration,
)
from specpilot.policies.controller.catch_up import RESUME_HORIZON, CatchUp, finishing_catch_up
from specpilot.policies.controller.exploration import (
    EXPLORE_SAMPLES,
    MAX_PROBE_GAP,
    RETIME_SAMPLES,
    Exploration,
)
from specpilot.policies.controller.finishing import finishing_quantile, finishing_steps
from specpilot.policies.controller.plan_search import best_plan, finish_plan, plan_value
from specpilot.policies.controller.planner import GoodputController, PlanNote, PlanObserver
from specpilot.policies.controller.row_policy import GoodputPolicy
from specpilot.policies.controller.step_costs import SAMPLE_AGE, StepCosts

__all__ = [
    "EXPLORE_SAMPLES",
    "FINISH_POOLING",
    "MAX_PROBE_GAP",
    "PRIOR_ACCEPTANCE",
    "RESUME_HORIZON",
    "RETIME_SAMPLES",
    "SAMPLE_AGE",
    "AcceptanceByPosition",
    "BatchAcceptance",
    "CatchUp",
    "ConfidenceCalibration",
    "Exploration",
    "GoodputController",
    "GoodputPolicy",
    "PlanNote",
    "PlanObserver",
    "StepCosts",
    "best_plan",
    "finish_plan",
    "finishing_catch_up",
    "finishing_quantile",
    "finishing_steps",
    "plan_value",
]
