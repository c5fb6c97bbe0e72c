"""The decode loop, its statistics and stopping rules."""

from specpilot.engine.request import GenerationResult, Request
from specpilot.engine.scheduler import Scheduler
from specpilot.engine.speculative import SpeculativeEngine
from specpilot.engine.stats import GenerationStats

__all__ = ["GenerationResult", "GenerationStats", "Request", "Scheduler", "SpeculativeEngine"]
