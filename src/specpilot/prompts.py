"""Prompt records read from JSONL files, and answering a multi-turn conversation.

The native format is Spec-Bench/MT-Bench JSONL: one object per line with `question_id`,
optional `category`, and `turns` (a list of user messages); the other prompt sets in
`shared/data` (HumanEval, GSM8K, Alpaca, ShareGPT) are read too. Multi-turn prompts are answered
turn by turn, each answer fed back as the assistant turn before the next user turn.
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


def _turns_of(row: dict) -> list[str] | None:
    """User turns of a record in any supported format (see module docstring)."""
    if "turns" in row:
        return row["turns"]
    if "conversations" in row:  # ShareGPT: the first user turn
        human = [
            m.get("value", "") for m in row["conversations"] if m.get("from") in ("human", "user")
        ]
        return human[:1] or None
    if "instruction" in row:  # Alpaca / AlpacaEval
        extra = row.get("input") or ""
        return [row["instruction"] + (f"\n\n{extra}" if extra else "")]
    for key in ("prompt", "question"):  # HumanEval, GSM8K
        if key in row:
            return [row[key]]
    return None


def read_prompts_file(path: str | Path) -> list[PromptRecord]:
    """Records of a JSONL prompt file. Formats: Spec-Bench/MT-Bench (`question_id`, `category`,
    `turns`), HumanEval (`prompt`), GSM8K (`question`), Alpaca (`instruction`, `input`), ShareGPT
    (`conversations`, first user turn). Files without categories are named by the file's stem."""
    path = Path(path)
    default_category = path.stem.split("_")[0]
    records = []
    for index, row in enumerate(read_jsonl(path)):
        turns = _turns_of(row)
        if not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise PromptError(
                f"{path}: record {index + 1} has no usable prompt: expected non-empty 'turns' "
                "(a list "
                "of strings), 'prompt', 'question', 'instruction' or 'conversations'"
            )
        question_id = row.get("question_id", row.get("task_id", row.get("id", index)))
        records.append(
            PromptRecord(question_id, tuple(turns), row.get("category", default_category))
        )
    if not records:
        raise PromptError(f"{path}: no prompts in the file")
    return records


def answer_conversations(
    engine,
    conversations: list[tuple[str, ...] | list[str]],
    config: GenerationConfig,
    on_tokens: Callable[[int, list[int]], None] | None = None,
    on_turn_end: Callable[[], None] | None = None,
) -> list[list]:
    """Answer several conversations as one batch, turn by turn: turn t of every conversation that
    has one is decoded together, its answer fed back as the assistant turn. Returns each
    conversation's results (one GenerationResult per turn)."""
    histories: list[list[dict[str, str]]] = [[] for _ in conversations]
    results: list[list] = [[] for _ in conversations]
    for t in range(max(len(turns) for turns in conversations)):
        live = [i for i, turns in enumerate(conversations) if t < len(turns)]
        for i in live:
            histories[i].append({"role": "user", "content": conversations[i][t]})
        answers = engine.generate_batch([list(histories[i]) for i in live], config, on_tokens)
        for i, answer in zip(live, answers, strict=True):
            histories[i].append({"role": "assistant", "content": answer.text})
            results[i].append(answer)
        if on_turn_end is not None:
            on_turn_end()
    return results
