"""`specpilot profile-sv`: the offline acceptance profile SV plans with (SV paper §4.2, §7.3;
docs/methods.md §4.1).

Runs plain speculative decoding (constant γ_max, every drafted token verified) on profiling
prompts that are not evaluation prompts, and records for every drafted token the companion
indicators (S, A) and the target's acceptance probability α (greedy: 1 if the token is the
target's argmax; sampling: min(1, p_target/p_draft)). Fits the equal-frequency (S, A) table,
reports the information gain of (S, A), S and A about α, and stores the target's verify latency
curve T(n) next to the table, so one JSON file is all `--policy sv` needs.
"""

from __future__ import annotations

import time

import torch
from tqdm import tqdm

from specpilot.api import ModelPair, build_engine
from specpilot.bench.profile import PROFILE_PROMPTS, latency_curve
from specpilot.bench.report import machine_info
from specpilot.config import GenerationConfig, SamplingConfig
from specpilot.methods.sv import load_companion
from specpilot.policies.latency import read_verify_curves
from specpilot.policies.sv import Companion, acceptance_ratio, indicator_probs, indicators
from specpilot.policies.sv_table import AcceptanceTable, information_gain
from specpilot.types import Proposal, StepRecord

SV_PROFILE_PROMPTS = (
    *PROFILE_PROMPTS,
    "Explain what a hash table is and when you would use one.",
    "Write a short poem about autumn leaves.",
    "List the steps to make a cup of tea.",
    "Write a JavaScript function that debounces another function.",
    "What are the main causes of inflation? Answer in a paragraph.",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Write a SQL query that returns the ten most recent orders per customer.",
    "Describe the water cycle for a ten-year-old.",
)
"""Built-in profiling prompts (none of them from the evaluation sets in ../shared/data)."""


class IndicatorRecorder:
    """A verify policy that verifies everything and records (S, A) for each drafted token, and
    an engine observer (`record_alpha`) that records the target's α for it from the verify
    logits."""

    def __init__(self, companion: Companion):
        self.companion = companion
        self.s: list[float] = []
        self.a: list[float] = []
        self.alpha: list[float] = []
        self.samplings: dict[int, SamplingConfig] = {}
        """Each slot's decoding rule in the step being verified."""

    def reset(self) -> None:
        pass

    def select(self, sequences, proposals: list[Proposal], slots, samplings) -> list[int]:
        self.samplings = dict(zip(slots, samplings, strict=True))
        scored = self.companion.score(sequences, proposals, slots)
        for proposal, logits, sampling in zip(proposals, scored, samplings, strict=True):
            if logits is not None:
                draft_probs = indicator_probs(proposal.draft_logits, sampling)
                s, a = indicators(draft_probs, indicator_probs(logits, sampling), proposal.tokens)
                self.s.extend(s.tolist())
                self.a.extend(a.tolist())
        return [proposal.k for proposal in proposals]

    def observe(self, record: StepRecord) -> None:
        pass

    def record_alpha(
        self, slot: int, proposal: Proposal, target_logits: torch.Tensor, _record: StepRecord
    ) -> None:
        """α for each drafted token of a verified step ([k + 1, vocab] target logits)."""
        if not proposal.k:
            return
        tokens = torch.tensor(proposal.tokens)
        rows = target_logits[: proposal.k]
        sampling = self.samplings[slot]
        if sampling.greedy:
            alpha = (rows.argmax(-1) == tokens).float()
        else:
            draft_probs = indicator_probs(proposal.draft_logits, sampling)
            target_probs = indicator_probs(rows, sampling)
            alpha = acceptance_ratio(target_probs, draft_probs, tokens[:, None])[:, 0]
        self.alpha.extend(alpha.tolist())


def profile_sv(
    models: ModelPair,
    companion: str,
    prompts: list[str],
    config: GenerationConfig,
    gamma_max: int,
    bins: tuple[int, int] = (16, 16),
    min_count: int = 20,
    verify_ms: dict | None = None,
    max_verify: int = 64,
    progress: bool = True,
) -> dict:
    """Record, fit and summarise; `verify_ms` reuses curves from `specpilot profile` (else the
    curve at context 128 is measured here)."""
    recorder = IndicatorRecorder(Companion(load_companion(companion, models)))
    engine = build_engine(models, "model", "constant", verify_policy=recorder, k=gamma_max)
    engine.observers.append(recorder.record_alpha)
    start = time.perf_counter()
    for prompt in tqdm(prompts, desc="profile-sv", unit="prompt", disable=not progress):
        engine.generate([{"role": "user", "content": prompt}], config)
    run_s = time.perf_counter() - start
    if verify_ms is None:
        curve = latency_curve(models.target.runner, 128, max_verify, repeats=3)
        verify_ms = {"128": curve}
    s_bins, a_bins = bins
    table = AcceptanceTable.fit(recorder.s, recorder.a, recorder.alpha, s_bins, a_bins, min_count)
    return {
        "target": models.target.name,
        "draft": models.draft.name,
        "companion": companion,
        "backend": models.target.runner.backend,
        "gamma_max": gamma_max,
        "temperature": config.sampling.temperature,
        "prompts": len(prompts),
        "records": len(recorder.alpha),
        "mean_alpha": sum(recorder.alpha) / len(recorder.alpha),
        "run_s": run_s,
        "information_gain": information_gain(
            recorder.s, recorder.a, recorder.alpha, s_bins=s_bins, a_bins=a_bins
        ),
        "table": table.to_dict(),
        "verify_ms": verify_ms,
        "samples": {  # the raw records, to re-bin or re-estimate without re-running
            "s": [round(x, 5) for x in recorder.s],
            "a": [round(x, 5) for x in recorder.a],
            "alpha": [round(x, 5) for x in recorder.alpha],
        },
        "machine": machine_info(),
    }


def read_verify_ms(latency_profile: str) -> dict:
    """The verify latency curves T(n) of a `specpilot profile` JSON, keyed as in it."""
    return {str(c): ms for c, ms in read_verify_curves(latency_profile).items()}


def profile_summary(profile: dict) -> str:
    """How much was recorded, and what (S, A), S and A tell about acceptance."""
    gain = profile["information_gain"]
    return (
        f"{profile['records']} drafted tokens from {profile['prompts']} prompts, mean acceptance "
        f"{profile['mean_alpha']:.3f}\n"
        f"H(acceptance) {gain['H_X']:.3f} bits; information gain (plug-in / minus the "
        "shuffled-α baseline): "
        + ", ".join(
            f"{name} {gain['IG_' + key]:.3f} / {gain['IG_' + key + '_corrected']:.3f}"
            for name, key in (("(S, A)", "SA"), ("S", "S"), ("A", "A"))
        )
    )
