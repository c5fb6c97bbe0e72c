"""Draft and verify policies."""

from specpilot.policies.base import DraftPolicy, DraftToken, VerifyPolicy
from specpilot.policies.draft import ConstantPolicy, HeuristicPolicy
from specpilot.policies.svip import SvipPolicy
from specpilot.policies.verify_all import VerifyAll

__all__ = [
    "ConstantPolicy",
    "DraftPolicy",
    "DraftToken",
    "HeuristicPolicy",
    "SvipPolicy",
    "VerifyAll",
    "VerifyPolicy",
]
