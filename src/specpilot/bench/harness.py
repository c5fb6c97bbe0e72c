"""Run methods side by side on identical prompts and aggregate what was measured.

For each prompt (or batch of prompts of one category, with batch_size > 1), every method runs
back to back (so slow drift of the machine hits all methods alike), `repeats` times, each repeat
in the order of the last turned by one (so no method always runs first, or right after the same
other: a method listed last once ran last in every repeat of every batch). The first
prompt is run once per method before measuring (warm-up, excluded). Throughput per (method,
category) is Σ tokens / Σ seconds within one repeat, and the reported value is the median over
repeats; speedup divides by `ar`'s median in the same category.
Greedy identity compares each method's token ids with `ar`'s from the same run. In batched runs
draft_s/verify_s/other_s add up every row's view of the shared batch time (about B × the wall
time of a full batch); tokens/s is charged once (methods.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import zip_longest

from tqdm import tqdm

from specpilot.bench.methods import BenchMethod, TurnRun, make_method
from specpilot.bench.resume import RunLog
from specpilot.config import GenerationConfig
from specpilot.engine import GenerationStats
from specpilot.prompts import PromptRecord

BASELINE = "ar"


@dataclass
class PromptRuns:
    record: PromptRecord
    runs: list[list[TurnRun]] = field(default_factory=list)
    """One entry per repeat; each a list with one TurnRun per conversation turn."""


def category_batches(categories: list[str], batch_size: int) -> list[list[int]]:
    """Prompt indices in the order the bench runs them: batches of up to `batch_size` prompts
    formed within each category (so a category's throughput is measured on batches of its own
    prompts), the categories taking turns, so that a run stopped part-way has measured each
    alike."""
    by_category: dict[str, list[int]] = {}
    for i, category in enumerate(categories):
        by_category.setdefault(category, []).append(i)
    per_category = [
        [indices[j : j + batch_size] for j in range(0, len(indices), batch_size)]
        for _, indices in sorted(by_category.items())
    ]
    return [batch for turn in zip_longest(*per_category) for batch in turn if batch is not None]


def run_methods(
    specs: list[BenchMethod],
    records: list[PromptRecord],
    models,
    hf_models: dict,
    config: GenerationConfig,
    repeats: int,
    progress: bool = True,
    on_prompt_done: Callable[[dict[str, list[PromptRuns]]], None] | None = None,
    batch_size: int = 1,
    log: RunLog | None = None,
) -> dict[str, list[PromptRuns]]:
    """Every method on every prompt; `on_prompt_done` sees the finished prompts after each one
    (bench.run rewrites its JSON report there, so an interrupted run keeps what it measured).
    Prompts run in `category_batches`' order. With a `log`, batches it holds are taken from it
    and new ones are appended to it (bench.resume)."""
    methods = {spec.text: make_method(spec, models, hf_models) for spec in specs}
    finished = log.load() if log is not None else {}
    batches = category_batches([record.category for record in records], batch_size)
    if any(tuple(batch) not in finished for batch in batches):
        warm = GenerationConfig(max_new_tokens=8, sampling=config.sampling)
        for method in methods.values():  # warm-up: caches, allocator, lazy init; not measured
            method.run([records[0].turns[:1]] * min(batch_size, len(records)), warm)
    results = {name: [PromptRuns(r) for r in records] for name in methods}
    bar = tqdm(
        total=len(batches) * repeats * len(methods), desc="bench", unit="run", disable=not progress
    )
    done: list[int] = []
    for batch in batches:
        if tuple(batch) in finished:
            for name, prompts in finished[tuple(batch)].items():
                for i, repeat_runs in zip(batch, prompts, strict=True):
                    results[name][i].runs = repeat_runs
            bar.update(repeats * len(methods))
        else:
            conversations = [records[i].turns for i in batch]
            names = list(methods)
            for repeat in range(repeats):
                turn = repeat % len(names)
                for name in names[turn:] + names[:turn]:
                    method = methods[name]
                    for i, runs in zip(batch, method.run(conversations, config), strict=True):
                        results[name][i].runs.append(runs)
                    bar.update()
            if log is not None:
                log.append(
                    batch, {name: [results[name][i].runs for i in batch] for name in methods}
                )
        done.extend(batch)
        if on_prompt_done is not None:
            ready = sorted(done)
            on_prompt_done({name: [runs[i] for i in ready] for name, runs in results.items()})
    bar.close()
    return results


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _stats_of(prompt_runs: list[PromptRuns]) -> GenerationStats | None:
    parts = [turn.stats for p in prompt_runs for turn in p.runs[0] if turn.stats is not None]
    return GenerationStats.combined(parts) if parts else None


def _per_step(stats: GenerationStats | None, field: str) -> float | None:
    """Mean of a per-step count (drafted, verified, accepted depth; nodes) over verify steps."""
    return getattr(stats, field) / stats.steps if stats and stats.steps else None


def _histogram(stats: GenerationStats) -> list[int]:
    """Steps by number of accepted draft tokens (index = num_accepted)."""
    counts = [0] * (max((r.num_accepted for r in stats.records), default=0) + 1)
    for record in stats.records:
        counts[record.num_accepted] += 1
    return counts


def _draft_lengths(prompt_runs: PromptRuns) -> list[int]:
    """Tokens drafted per step on one prompt (first repeat, all turns): how a policy adapts."""
    return [r.num_drafted for turn in prompt_runs.runs[0] if turn.stats for r in turn.stats.records]


def summarize(results: dict[str, list[PromptRuns]], greedy: bool) -> list[dict]:
    """Rows per (method, category) plus category 'all'."""
    categories = sorted({p.record.category for p in next(iter(results.values()))})
    rows = []
    baseline_speed: dict[str, float] = {}
    for name in [BASELINE, *[n for n in results if n != BASELINE]]:
        for category in [*categories, "all"]:
            subset = [p for p in results[name] if category in ("all", p.record.category)]
            baseline = [p for p in results[BASELINE] if category in ("all", p.record.category)]
            repeats = len(subset[0].runs)
            speeds = []
            for r in range(repeats):
                tokens = sum(len(t.token_ids) for p in subset for t in p.runs[r])
                seconds = sum(t.seconds for p in subset for t in p.runs[r])
                speeds.append(tokens / seconds if seconds else 0.0)
            speed = statistics.median(speeds)
            if name == BASELINE:
                baseline_speed[category] = speed
            stats = _stats_of(subset)
            mismatches, divergences = 0, []
            for mine, base in zip(subset, baseline, strict=False):
                for turn, (a, b) in enumerate(zip(mine.runs[0], base.runs[0], strict=False)):
                    position = first_divergence(a.token_ids, b.token_ids)
                    if position is not None:
                        mismatches += 1
                        divergences.append(
                            {
                                "question_id": mine.record.question_id,
                                "turn": turn,
                                "position": position,
                            }
                        )
                        break
            rows.append(
                {
                    "method": name,
                    "category": category,
                    "prompts": len(subset),
                    "new_tokens": sum(len(t.token_ids) for p in subset for t in p.runs[0]),
                    "tokens_per_s": speed,
                    "tokens_per_s_repeats": speeds,
                    "speedup": speed / baseline_speed[category]
                    if baseline_speed.get(category)
                    else None,
                    "mean_accepted_tokens": stats.mean_accepted_tokens if stats else None,
                    "mean_draft_length": _per_step(stats, "drafted"),
                    "mean_verify_length": _per_step(stats, "verified"),
                    "mean_verify_nodes": _per_step(stats, "nodes"),  # tree siblings included
                    # the longest draft that would have been fully accepted, per step: exact after
                    # a rejection, a lower bound (the draft length) when all were accepted
                    "mean_oracle_length": _per_step(stats, "accepted"),
                    "acceptance_rate": stats.acceptance_rate if stats and stats.verified else None,
                    "draft_s": stats.draft_s if stats else None,
                    "verify_s": stats.verify_s if stats else None,
                    "other_s": stats.other_s if stats else None,
                    "acceptance_by_position": stats.acceptance_by_position if stats else None,
                    "accepted_histogram": _histogram(stats) if stats else None,
                    "draft_lengths": _draft_lengths(subset[0]) if stats else None,
                    "greedy_mismatches": mismatches if greedy else None,
                    "divergences": divergences if greedy else None,
                }
            )
    return rows
