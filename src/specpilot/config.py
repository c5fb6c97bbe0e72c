"""Typed, validated configuration dataclasses.

Each config checks its values in `__post_init__` and raises `ConfigError` with a message that
says which value is wrong and what is allowed, so bad input fails before any model is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specpilot.errors import ConfigError


def require(condition: bool, message: str, options: tuple[str, ...] = ()) -> None:
    """Raise `ConfigError(message, options)` unless `condition` holds."""
    if not condition:
        raise ConfigError(message, options)


@dataclass(frozen=True)
class SamplingConfig:
    """How a token is chosen from logits. temperature 0 means greedy (argmax)."""

    temperature: float = 0.0
    """0 for greedy decoding; > 0 samples from softmax(logits / temperature)."""
    top_k: int = 0
    """Keep only the k most likely tokens before sampling; 0 keeps all."""
    top_p: float = 1.0
    """Keep the smallest set of tokens whose probability reaches top_p; 1.0 keeps all."""

    def __post_init__(self) -> None:
        require(
            self.temperature >= 0, f"temperature must be >= 0 (0 = greedy), got {self.temperature}"
        )
        require(self.top_k >= 0, f"top_k must be >= 0 (0 = no top-k filter), got {self.top_k}")
        require(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class GenerationConfig:
    """What to generate: length, stopping and sampling."""

    max_new_tokens: int = 1024
    """Upper bound on generated tokens (also enforced when reached in the middle of a draft).
    Generation ends earlier at EOS, a stop string or the end of the context (finish_reason
    "length"), so the default lets an answer finish; benchmarks set a fixed, smaller budget."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int = 0
    """Seed of the generator used for drafting and verification, so sampled runs reproduce."""
    stop_strings: tuple[str, ...] = ()
    """Generation stops once the text contains any of these; the text is cut before it."""
    stop_on_eos: bool = True
    """Stop at the tokenizer's end-of-sequence token(s)."""

    def __post_init__(self) -> None:
        require(self.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        require(all(s for s in self.stop_strings), "stop strings must be non-empty")
