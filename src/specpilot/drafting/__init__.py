"""Drafters: propose tokens for the target to verify."""

from specpilot.drafting.base import Drafter
from specpilot.drafting.model import ModelDrafter
from specpilot.drafting.ngram import NgramDrafter

__all__ = ["Drafter", "ModelDrafter", "NgramDrafter"]
