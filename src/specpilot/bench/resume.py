"""Resumable benches: each finished batch's raw runs are appended to a log beside the JSON report,
so re-running the same command continues where an interrupted run stopped (a session ends, a
machine is reclaimed; a 1.5B bench of seven methods takes hours on two cores).

The log's first line is its key: the bench configuration and the machine. Runs measured under
another configuration or on another CPU are never mixed into one report (speedups are ratios
within one machine); such a log is refused with the way out in the message."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from specpilot.bench.methods import TurnRun
from specpilot.engine import GenerationStats
from specpilot.errors import ConfigError
from specpilot.types import StepRecord

RUNS_SUFFIX = ".runs.jsonl"

BatchRuns = dict[str, list[list[list[TurnRun]]]]
"""Per method, per prompt of the batch, per repeat: one TurnRun per conversation turn."""


def runs_path(json_out: str | Path) -> Path:
    """report.json → report.runs.jsonl"""
    return Path(json_out).with_suffix(RUNS_SUFFIX)


def _turn_to_json(turn: TurnRun) -> dict:
    stats = turn.stats
    return {
        "ids": turn.token_ids,
        "seconds": turn.seconds,
        "stats": None
        if stats is None
        else {
            "prefill_s": stats.prefill_s,
            "prefill_tokens": stats.prefill_tokens,
            "total_s": stats.total_s,
            "records": [asdict(record) for record in stats.records],
        },
    }


def _turn_from_json(data: dict) -> TurnRun:
    stats = None
    if data["stats"] is not None:
        stats = GenerationStats()
        for record in data["stats"]["records"]:
            stats.add(StepRecord(**record))
        stats.prefill_s = data["stats"]["prefill_s"]
        stats.prefill_tokens = data["stats"]["prefill_tokens"]
        stats.total_s = data["stats"]["total_s"]
    return TurnRun(data["ids"], data["seconds"], stats)


def _map_turns(runs: dict, convert) -> dict:
    """`convert` applied to every turn of every repeat of every prompt of every method."""
    return {
        name: [[[convert(turn) for turn in turns] for turns in repeats] for repeats in prompts]
        for name, prompts in runs.items()
    }


class RunLog:
    """Append-only JSONL of finished batches under a key line."""

    def __init__(self, path: str | Path, key: dict):
        self.path = Path(path)
        self.key = json.loads(json.dumps(key))  # as it reads back (tuples become lists)

    def load(self) -> dict[tuple[int, ...], BatchRuns]:
        """The batches already measured; a half-written last line (a killed run) is cut off."""
        if not self.path.exists():
            return {}
        lines = self.path.read_bytes().split(b"\n")
        entries, valid_bytes = [], 0
        for line in lines:
            try:
                entries.append(json.loads(line))
            except ValueError:
                break
            valid_bytes += len(line) + 1
        if not entries or entries[0].get("key") != self.key:
            found = entries[0].get("key") if entries else "nothing readable"
            raise ConfigError(
                f"{self.path} holds runs of another bench configuration or machine "
                f"({_difference(found, self.key)}); use another json_out, or delete that file "
                "to start over",
                ("json_out",),
            )
        with open(self.path, "r+b") as log:
            log.truncate(min(valid_bytes, log.seek(0, os.SEEK_END)))
        return {
            tuple(entry["batch"]): _map_turns(entry["runs"], _turn_from_json)
            for entry in entries[1:]
        }

    def append(self, batch: list[int], runs: BatchRuns) -> None:
        lines = [] if self.path.exists() else [{"key": self.key}]
        lines.append({"batch": list(batch), "runs": _map_turns(runs, _turn_to_json)})
        with open(self.path, "a") as log:
            log.write("".join(json.dumps(line) + "\n" for line in lines))
            log.flush()
            os.fsync(log.fileno())


def _difference(found, expected: dict) -> str:
    """The first key field that differs, for the error message."""
    if not isinstance(found, dict):
        return f"its first line is {found!r}"
    for section in expected:
        mine, theirs = found.get(section), expected[section]
        if isinstance(mine, dict) and isinstance(theirs, dict):
            for field in theirs:
                if mine.get(field) != theirs[field]:
                    return f"{section}.{field}: logged {mine.get(field)!r}, now {theirs[field]!r}"
        elif mine != theirs:
            return f"{section}: logged {mine!r}, now {theirs!r}"
    return "its key differs"
