"""Names → engine: the method spec, the drafter and policy tables, their defaults, and the
builder that turns a spec and loaded models into an engine."""

from specpilot.methods.build import engine_for
from specpilot.methods.drafters import DRAFTERS, make_drafter
from specpilot.methods.policies import POLICIES, make_policy
from specpilot.methods.spec import MethodSpec

__all__ = ["DRAFTERS", "POLICIES", "MethodSpec", "engine_for", "make_drafter", "make_policy"]
