"""When to stop: EOS tokens, stop strings, max_new_tokens, the end of the context.

`StopChecker.cut(generated)` returns how many of the generated tokens to keep and why generation
ends (or None to go on). Tokens after an EOS are dropped (the EOS itself is kept, as in
transformers); a stop string cuts at the first token whose text completes it, and the returned
text ends before the stop string.
"""

from __future__ import annotations

from dataclasses import dataclass

from specpilot.config import GenerationConfig


@dataclass
class StopChecker:
    eos_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    max_new_tokens: int
    decode: object = None
    """tokenizer-like decode(ids) -> str, needed only for stop strings."""

    @classmethod
    def for_request(cls, config: GenerationConfig, eos_ids: frozenset[int], tokenizer):
        """The stop rule of one request with this config."""
        eos = eos_ids if config.stop_on_eos else frozenset()
        return cls(eos, config.stop_strings, config.max_new_tokens, tokenizer.decode)

    def cut(self, generated: list[int], checked: int) -> tuple[int, str | None]:
        """Scan generated[checked:] (tokens added this step); return (tokens to keep, reason)."""
        for i in range(checked, len(generated)):
            if generated[i] in self.eos_ids:
                return i + 1, "eos"
        if self.stop_strings:
            hit = self._stop_string_end(generated, checked)
            if hit is not None:
                return hit, "stop"
        if len(generated) >= self.max_new_tokens:
            return self.max_new_tokens, "length"
        return len(generated), None

    def _stop_string_end(self, generated: list[int], checked: int) -> int | None:
        if not any(s in self.decode(generated) for s in self.stop_strings):
            return None
        for n in range(max(1, checked), len(generated) + 1):
            text = self.decode(generated[:n])
            if any(s in text for s in self.stop_strings):
                return n
        return None

    def trim_text(self, text: str) -> str:
        """Cut the text before the first stop string."""
        cut = min((text.find(s) for s in self.stop_strings if s in text), default=-1)
        return text if cut < 0 else text[:cut]
