"""One `specpilot bench` run: pick the methods and prompts, measure them, and build the report
(machine, rooflines, settings, results), rewritten after every prompt so that an interrupted run
keeps what it measured."""

from __future__ import annotations

import json
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from specpilot.api import ModelPair
from specpilot.bench.harness import BASELINE, run_methods, summarize
from specpilot.bench.methods import BenchMethod, parse_method
from specpilot.bench.report import machine_info, memory_bandwidth_gbs
from specpilot.bench.resume import RunLog, runs_path
from specpilot.config import GenerationConfig, require
from specpilot.errors import ConfigError
from specpilot.methods.build import resolved_for
from specpilot.methods.defaults import DEFAULT_TARGET
from specpilot.prompts import PromptRecord, read_prompts_file


def bench_methods(
    texts: list[str], batch_size: int = 1, target: str = DEFAULT_TARGET
) -> list[BenchMethod]:
    """The baseline first, then `texts` (default: sd, plus transformers' assisted generation when
    decoding one prompt at a time, the only way it runs), drafting as `target`'s default where
    they name no drafter."""
    texts = texts or (["sd", "hf-assisted"] if batch_size == 1 else ["sd"])
    specs = [parse_method(t, target) for t in [BASELINE, *(t for t in texts if t != BASELINE)]]
    specs = [s for s in specs if s.kind != "llama-cpp" or not _skipped(s.text)]
    hf_specs = [s.text for s in specs if s.kind.startswith("hf")]
    if batch_size > 1 and hf_specs:
        raise ConfigError(
            f"{', '.join(hf_specs)}: transformers' assisted generation and prompt lookup run "
            "one sequence at a time; use batch_size 1 for them",
            ("batch_size",),
        )
    return specs


def _skipped(text: str) -> bool:
    """A llama-cpp peer whose binary is not built: one line on stderr, and the bench goes on."""
    from specpilot.bench.llama_cpp_peer import skip_line

    line = skip_line(text)
    if line:
        print(line, file=sys.stderr)
    return line is not None


def select_prompts(
    paths: list[str], limit: int | None, max_turns: int | None, seed: int | None = None
) -> list[PromptRecord]:
    """Prompts from every file, `limit` per category, at most `max_turns` turns each.

    Without a seed the first `limit` of each category are taken (stable across runs and files);
    with one, a seeded random sample of `limit` per category, kept in file order.
    """
    every = [
        PromptRecord(r.question_id, r.turns[:max_turns] if max_turns else r.turns, r.category)
        for path in paths
        for r in read_prompts_file(path)
    ]
    by_category: dict[str, list[PromptRecord]] = {}
    for record in every:
        by_category.setdefault(record.category, []).append(record)
    chosen: set[int] = set()
    for records in by_category.values():
        if limit is None or limit >= len(records):
            picked = records
        elif seed is None:
            picked = records[:limit]
        else:
            picked = random.Random(f"{seed}:{records[0].category}").sample(records, limit)
        chosen.update(id(r) for r in picked)
    return [r for r in every if id(r) in chosen]


def write_json(path: str | Path, document: dict) -> None:
    """Atomic: a reader (or a killed run) never sees half a report."""
    temporary = f"{path}.tmp"
    with open(temporary, "w") as out:
        out.write(json.dumps(document, indent=1))
    os.replace(temporary, path)


@dataclass(frozen=True)
class BenchSettings:
    """How the prompts were chosen and how often each method runs (the report's "config")."""

    prompts: tuple[str, ...]
    limit: int | None = None
    seed: int | None = None
    """Draws the `limit` sample per category (None: the first `limit`)."""
    max_turns: int | None = None
    repeats: int = 1
    batch_size: int = 1

    def __post_init__(self) -> None:
        require(self.repeats >= 1, f"repeats must be >= 1, got {self.repeats}", ("repeats",))
        require(
            self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}", ("batch_size",)
        )


def rooflines(models: ModelPair) -> dict:
    """Per loaded model served by the lean decoder: bytes streamed per token and the time that
    takes at this machine's measured memory bandwidth (the floor of a decoding step)."""
    bandwidth = memory_bandwidth_gbs()
    floors = {}
    for role in ("target", "draft"):
        model = getattr(models, role)
        if model is not None and hasattr(model.runner, "streamed_bytes"):
            size = model.runner.streamed_bytes
            floors[role] = {"streamed_bytes": size, "roofline_ms_per_token": size / bandwidth / 1e6}
    return {"machine": {**machine_info(), "memory_bandwidth_gbs": bandwidth}, "rooflines": floors}


def run_bench(
    models: ModelPair,
    specs: list[BenchMethod],
    records: list[PromptRecord],
    config: GenerationConfig,
    settings: BenchSettings,
    json_out: str | None = None,
    progress: bool = True,
    hf_models: dict | None = None,
) -> dict:
    """Measure every method on `records` and return the report; with `json_out` the report is
    written there after every prompt (`complete` false until the end) and the raw runs are
    logged beside it, so the same command resumes an interrupted run (bench.resume).
    `hf_models`: the transformers copies the hf methods need (bench.methods.load_hf_models)."""
    document = {
        **rooflines(models),
        "config": {
            "target": models.target.name,
            "draft": None if models.draft is None else models.draft.name,
            "dtype": str(models.target.runner.dtype),
            "max_new_tokens": config.max_new_tokens,
            "temperature": config.sampling.temperature,
            "repeats": settings.repeats,
            "batch_size": settings.batch_size,
            "prompts": list(settings.prompts),
            "limit": settings.limit,
            "seed": settings.seed,
            "max_turns": settings.max_turns,
            "methods": [s.text for s in specs],
            "resolved": {s.text: str(resolved_for(s.spec, models)) for s in specs if s.spec},
        },
    }

    def write_partial(done: dict) -> None:
        if json_out:
            rows = summarize(done, config.sampling.greedy)
            partial = {**document, "complete": False, "prompts_done": len(done[BASELINE])}
            write_json(json_out, {**partial, "results": rows})

    results = run_methods(
        specs,
        records,
        models,
        hf_models or {},
        config,
        settings.repeats,
        progress=progress,
        on_prompt_done=write_partial,
        batch_size=settings.batch_size,
        log=RunLog(runs_path(json_out), _log_key(document)) if json_out else None,
    )
    rows = summarize(results, config.sampling.greedy)
    document.update(complete=True, prompts_done=len(records), results=rows)
    if json_out:
        write_json(json_out, document)
    return document


def _log_key(document: dict) -> dict:
    """What must match for logged runs to join a report: the configuration and the machine
    (CPU model, threads, torch); the measured bandwidth varies run to run and is left out."""
    machine = {k: v for k, v in document["machine"].items() if k != "memory_bandwidth_gbs"}
    return {"config": document["config"], "machine": machine}


def write_report_plots(rows: list[dict], plots: str | None, json_out: str | None) -> list[Path]:
    """The report's PNG plots under the prefix `plots` (default: `json_out` without its suffix);
    none when neither is given."""
    if not (plots or json_out):
        return []
    from specpilot.bench.plots import write_plots

    return write_plots(rows, Path(plots) if plots else Path(json_out).with_suffix(""))
