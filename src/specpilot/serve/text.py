"""Streaming text from token ids: each step's new text, never a stop string or half a
character.

Text is decoded from all ids so far (a token's text can depend on its neighbours), and held back
while it ends in an incomplete UTF-8 sequence or could still be the start of a stop string; the
final piece comes from the engine's result, so the streamed pieces add up to its text."""

from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, stop_strings: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop_strings = stop_strings
        self.hold = max((len(s) for s in stop_strings), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0

    def add(self, ids: list[int]) -> str:
        """The new text that is safe to send after these tokens."""
        self.ids.extend(ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        cut = min((text.find(s) for s in self.stop_strings if s in text), default=-1)
        safe = cut if cut >= 0 else len(text) - self.hold
        return self._take(text, safe)

    def finish(self, final_text: str) -> str:
        """The rest of the request's final text."""
        return self._take(final_text, len(final_text))

    def _take(self, text: str, end: int) -> str:
        piece = text[self.sent : end] if end > self.sent else ""
        self.sent += len(piece)
        return piece
