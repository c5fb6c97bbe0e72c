"""The decode loop, its statistics and stopping rules."""

from specpilot.engine.speculative import GenerationResult, SpeculativeEngine
from specpilot.engine.stats import GenerationStats

__all__ = ["GenerationResult", "GenerationStats", "SpeculativeEngine"]
