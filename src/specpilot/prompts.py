"""Prompt records read from JSONL files, and answering a multi-turn conversation.

The native format is Spec-Bench/MT-Bench JSONL: one object per line with `question_id`,
optional `category`, and `turns` (a list of user messages). Multi-turn prompts are answered turn
by turn, each answer fed back as the assistant turn before the next user turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specpilot.config import GenerationConfig
from specpilot.errors import PromptError


@dataclass(frozen=True)
class PromptRecord:
    question_id: str | int
    turns: tuple[str, ...]
    category: str = "default"


def read_jsonl(path: str | Path) -> list[dict]:
    """Objects of a JSONL file; a clear error names the file and line of anything malformed."""
    path = Path(path)
    if not path.is_file():
        raise PromptError(f"prompts file not found: {path}")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise PromptError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise PromptError(f"{path}:{number}: expected a JSON object per line")
        rows.append(row)
    return rows


def read_prompts_file(path: str | Path) -> list[PromptRecord]:
    """Records of a JSONL file in the `question_id` / `turns` format (`prompt` also accepted)."""
    records = []
    for index, row in enumerate(read_jsonl(path)):
        turns = row.get("turns", [row["prompt"]] if "prompt" in row else None)
        if not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise PromptError(f"{path}: record {index + 1} needs non-empty 'turns' (a list of strings)")
        records.append(PromptRecord(row.get("question_id", index), tuple(turns), row.get("category", "default")))
    if not records:
        raise PromptError(f"{path}: no prompts in the file")
    return records


def answer_turns(
    engine,
    turns: tuple[str, ...] | list[str],
    config: GenerationConfig,
    on_tokens: Callable[[list[int]], None] | None = None,
    on_turn_end: Callable[[], None] | None = None,
) -> list:
    """Generate an answer for each user turn, feeding answers back as assistant turns."""
    messages: list[dict[str, str]] = []
    results = []
    for turn in turns:
        messages.append({"role": "user", "content": turn})
        result = engine.generate(messages, config, on_tokens=on_tokens)
        messages.append({"role": "assistant", "content": result.text})
        results.append(result)
        if on_turn_end is not None:
            on_turn_end()
    return results
