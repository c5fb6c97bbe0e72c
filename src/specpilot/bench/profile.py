"""`specpilot profile`: the hardware facts adaptive policies plan with.

Measures, for one target/draft pair on this machine: the verify latency curve T_target(n) for n
new tokens at a few context lengths, the draft's one-token step time, the cost ratio
c = T_draft(1) / T_target(1), and, from short speculative runs, the per-position acceptance and
measured speedup for each draft length γ next to the theoretical bound
(1 − α^(γ+1)) / ((1 − α)(γc + 1)) (Leviathan et al.). Later policies (SV, LTD) read the JSON.
"""

from __future__ import annotations

import statistics
import time

import torch
from tqdm import tqdm

from specpilot.api import ModelPair, build_engine
from specpilot.bench.report import machine_info
from specpilot.config import GenerationConfig, require
from specpilot.engine import GenerationStats

PROFILE_PROMPTS = (
    "Write a Python function that merges two sorted lists into one sorted list.",
    "A train travels 180 km in 2.5 hours. What is its average speed in km/h? Explain briefly.",
    "Give three tips for writing clear commit messages.",
    "Summarize the plot of a detective story in four sentences.",
)


def speedup_bound(alpha: float, gamma: int, cost_ratio: float) -> float:
    """Expected speedup of chain SD with i.i.d. acceptance α, γ drafted tokens, draft cost c."""
    expected_tokens = gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return expected_tokens / (gamma * cost_ratio + 1)


def _median_ms(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def latency_curve(runner, context: int, max_new: int, repeats: int, progress=None) -> list[float]:
    """Milliseconds of one forward over n = 1..max_new new tokens after `context` cached ones."""
    return latency_points(runner, context, range(1, max_new + 1), repeats, progress)


def latency_points(runner, context: int, sizes, repeats: int, progress=None) -> list[float]:
    """Milliseconds of one forward over each of `sizes` new tokens after `context` cached ones."""
    runner.reset()
    span = min(1000, runner.vocab_size - 3)
    count = context + max(sizes)
    filler = [3 + (i * 7919) % span for i in range(count)]  # arbitrary ordinary token ids
    runner.forward(filler[:context], logits="none")
    curve = []
    for n in sizes:
        new = filler[context : context + n]

        def step(new=new):
            runner.forward(new, logits="all")
            runner.rollback(context)

        step()  # warm-up for this shape
        curve.append(_median_ms(step, repeats))
        if progress is not None:
            progress.update()
    runner.reset()
    return curve


def eagle_step_ms(models: ModelPair, head: str | None, context: int, repeats: int) -> dict:
    """Milliseconds of one feature-drafter step (its block over the new entries, then its LM
    head) after `context` committed pairs: for 1 entry (a chain step) and for 8 (a tree
    level of the default frontier)."""
    from specpilot.methods import make_drafter

    drafter = make_drafter("eagle", models, **({} if head is None else {"eagle_head": head}))
    hidden = torch.zeros(8, drafter.head.shape.hidden_size, dtype=drafter.inputs.dtype)
    timings = {}
    for rows in (1, 8):

        def step(rows=rows):
            drafter.draft_step(0, hidden[:rows], [3] * rows, context)

        step()
        timings[rows] = _median_ms(step, repeats)
    return timings


def profile_pair(
    models: ModelPair,
    contexts: tuple[int, ...] = (128, 512, 1024),
    max_verify: int = 64,
    gammas: tuple[int, ...] = (1, 2, 3, 4, 5),
    repeats: int = 3,
    max_new_tokens: int = 48,
    prompts: tuple[str, ...] = PROFILE_PROMPTS,
    progress: bool = True,
    eagle_head: str | None = None,
) -> dict:
    """`eagle_head`: also time the feature drafter with this head (a folder, or "default" for
    the head committed for the target)."""
    require(all(c >= 1 for c in contexts), "context lengths must be >= 1")
    require(max_verify >= 1 and repeats >= 1, "max_verify and repeats must be >= 1")
    require(all(g >= 1 for g in gammas), "gammas must be >= 1")
    target = models.target.runner
    bar = tqdm(total=len(contexts) * max_verify, desc="verify latency", disable=not progress)
    curves = {str(c): latency_curve(target, c, max_verify, repeats, bar) for c in contexts}
    bar.close()
    context = contexts[0]
    target_step_ms = curves[str(context)][0]
    draft_step_ms = None
    if models.draft is not None:
        draft_step_ms = latency_curve(models.draft.runner, context, 1, repeats)[0]
    eagle_ms = None
    if eagle_head is not None:
        head = None if eagle_head == "default" else eagle_head
        eagle_ms = eagle_step_ms(models, head, context, repeats)
    config = GenerationConfig(max_new_tokens=max_new_tokens)

    def run(engine) -> GenerationStats:
        return GenerationStats.combined([engine.generate(p, config).stats for p in prompts])

    ar = run(build_engine(models, drafter="none"))
    runs = []
    for gamma in tqdm(
        gammas, desc="speculative runs", disable=not progress or models.draft is None
    ):
        if models.draft is None:
            break
        stats = run(build_engine(models, drafter="model", policy="constant", k=gamma))
        runs.append((gamma, stats))
    cost_ratio = draft_step_ms / target_step_ms if draft_step_ms else None
    all_stats = GenerationStats.combined([s for _, s in runs]) if runs else None
    alpha = all_stats.acceptance_rate if all_stats else None
    return {
        "target": models.target.name,
        "draft": models.draft.name if models.draft else None,
        "dtype": str(target.dtype),
        "contexts": list(contexts),
        "verify_ms": curves,
        "target_step_ms": target_step_ms,
        "draft_step_ms": draft_step_ms,
        "cost_ratio": cost_ratio,
        "eagle_step_ms": eagle_ms,
        "eagle_cost_ratio": None if eagle_ms is None else eagle_ms[1] / target_step_ms,
        "acceptance_rate": alpha,
        "acceptance_by_position": all_stats.acceptance_by_position if all_stats else None,
        "ar_tokens_per_s": ar.tokens_per_s,
        "gammas": [
            {
                "gamma": gamma,
                "acceptance_rate": stats.acceptance_rate,
                "mean_accepted_tokens": stats.mean_accepted_tokens,
                "theoretical_speedup": speedup_bound(stats.acceptance_rate, gamma, cost_ratio),
                "measured_speedup": stats.tokens_per_s / ar.tokens_per_s,
            }
            for gamma, stats in runs
        ],
        "machine": machine_info(),
    }


def profile_table(profile: dict) -> str:
    lines = [
        f"target step {profile['target_step_ms']:.1f} ms"
        + (
            f", draft step {profile['draft_step_ms']:.1f} ms, c = {profile['cost_ratio']:.3f}"
            if profile["draft_step_ms"]
            else ""
        ),
    ]
    if profile.get("eagle_step_ms"):
        ms = profile["eagle_step_ms"]
        lines.append(
            f"eagle draft step {ms[1]:.1f} ms (c = {profile['eagle_cost_ratio']:.3f}), "
            f"a tree level of 8 {ms[8]:.1f} ms"
        )
    for context, curve in profile["verify_ms"].items():
        marks = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= len(curve)]
        shown = ", ".join(f"n={n}: {curve[n - 1] / curve[0]:.2f}x" for n in marks)
        lines.append(f"T_target(n)/T_target(1) at context {context}: {shown}")
    if profile["gammas"]:
        lines.append(f"{'gamma':>5s} {'alpha':>6s} {'MAT':>5s} {'bound':>6s} {'measured':>8s}")
        for row in profile["gammas"]:
            lines.append(
                f"{row['gamma']:5d} {row['acceptance_rate']:6.3f} "
                f"{row['mean_accepted_tokens']:5.2f} {row['theoretical_speedup']:6.2f} "
                f"{row['measured_speedup']:8.2f}"
            )
    return "\n".join(lines)
