"""specpilot: lossless, adaptive speculative decoding.

from specpilot import load_models, build_engine, GenerationConfig
models = load_models()                      # offline Qwen2.5-Coder 1.5B target + 0.5B draft
engine = build_engine(models)                # the draft model, the goodput controller
result = engine.generate("Write a haiku about caches.", GenerationConfig(max_new_tokens=64))
print(result.text, result.stats.mean_accepted_tokens)
"""

from specpilot.api import ModelPair, build_engine, load_models
from specpilot.config import GenerationConfig, SamplingConfig
from specpilot.engine import GenerationResult, GenerationStats, SpeculativeEngine
from specpilot.errors import SpecpilotError

__all__ = [
    "GenerationConfig",
    "GenerationResult",
    "GenerationStats",
    "ModelPair",
    "SamplingConfig",
    "SpecpilotError",
    "SpeculativeEngine",
    "build_engine",
    "load_models",
]
