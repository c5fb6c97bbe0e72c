"""The goodput controller: before each step drafts, decide how many tokens each row of the batch
drafts (0: that row takes a plain step in the same target forward), maximising the expected
tokens per second of the whole step (docs/methods.md §7):

    G(k_1..k_B) = Σ_q (1 + E[N_q | k_q]) / (T_other + T_draft(k) + T_verify(B + Σ_q fed(k_q)))

E[N | k] = Σ_{n≤k} Π_{i≤n} a_i (policies.goodput) with a_i the row's forecast acceptance of
position i given the ones before (its own, shrunk towards the batch-wide one, whose first
position the target's confidence on the row's recent steps refines: `row_prior`); T_draft(k) one
forward per position over the rows still drafting for drafters whose forwards serve all rows at
once, in proportion to the total budget otherwise (DraftCost); fed(k) the tokens a row with
budget k has verified (k for chains, a tree's size, less when lookups come up short or SV
trims); T_other the rest of a step. Every term is
learned from the steps' own timings and outcomes (policies.latency), so no separate profiling
is needed; a `specpilot profile` curve, when given, is the prior. The all-zero plan (plain
decoding) is always a candidate, so by its own estimates the controller never plans below plain
decoding.

Losslessness: a budget is fixed before drafting from the past alone (the target's confidence
included: it is read from steps already verified), as for any adaptive draft length
(docs/methods.md §1.2). A row's budget depends on its batchmates' forecasts, so under
sampling a batched row keeps the target's distribution but not its solo tokens (§1.3).
"""

from __future__ import annotations

import itertools
import math
import operator
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

import torch

from specpilot.config import require
from specpilot.errors import ConfigError
from specpilot.policies.base import DraftPolicy, DraftToken
from specpilot.policies.goodput import expected_accepted, marginal_order
from specpilot.policies.latency import LatencyCurve
from specpilot.sampling import top_probability
from specpilot.types import StepRecord

PRIOR_ACCEPTANCE = 0.5
"""Acceptance assumed for a position nothing has been learned about yet."""

FINISH_POOLING = 8.0
"""Pseudo-steps of the batch-wide acceptance in each row's forecast when planning to finish a
batch soonest: that plan follows the row needing the most steps, and the least of several noisy
estimates is biased low, so rows' own few steps count for less there (untuned). Also what a
row's acceptance is uncertain by before its own steps (`finishing_steps`): at batch 8 with
the 0.5B draft rows' acceptance of k = 1 ran from 0.52 to 0.96 (sd ~0.13, against
sqrt(0.2 / 9) = 0.15 for 8 pseudo-steps)."""

EXPLORE_SAMPLES = 8
"""Verified first positions the batch-wide acceptance needs before the controller trusts it to
stop drafting: until then every step without drafting is a one-token probe. A few early
rejections would otherwise stop drafting for good, where drafting pays by a small margin (a
draft model costing ~0.4 of a target step): idle steps teach nothing, and probes grow rare."""

LONG_RUN_MEMORY = 0.998
"""Memory per verified row of the long-run batch-wide acceptance, which the recent one (the
controller's `memory`) is shrunk towards and drifts back to on steps where no row drafts."""

IDLE_MEMORY = 0.9
"""What the recent batch-wide acceptance keeps of its counts per step where no row drafts: a
spell of rejections is half forgotten after ~7 such steps (untuned)."""

MAX_PROBE_GAP = 512
"""The most steps without drafting between two probes."""

RETIME_SAMPLES = 2
"""Timings of a probe's verification size the controller needs before it trusts a verdict that
drafting cannot pay even if always accepted, which puts probes MAX_PROBE_GAP steps apart: a
timing may carry a one-off cost (the kernels a new shape builds on its first forward). In a
batch-2 run's warm-up the first 3-token verification took 305 ms, the next 209 ms (as later
ones did); their median, then the estimate, ruled drafting out on all 8 prompts, where constant
k = 1 paid 3 % (the curve now takes the lower of two, latency.py)."""

SAMPLE_AGE = (RETIME_SAMPLES + 1) * MAX_PROBE_GAP
"""Steps after which a verification timing is forgotten (drafting steps, for a draft timing).
At batch 2 on the AVX2-only CPU, a single 4-token verification timed while two other processes
ran (1504 ms against 445 for 3 tokens) ruled out drafting in both rows, the only plan that pays
when the batch finishes together, and probes (one token in one row) never re-timed 4 tokens: the
controller decoded plainly for the rest of the engine's life (BENCHMARKS §10.19). Forgotten, the
size reads from its neighbours again and the next plan that needs it re-times it. Long enough
that a verdict's re-timing probes, MAX_PROBE_GAP apart, keep their RETIME_SAMPLES timings."""

TARGET_CONFIDENCE_MEMORY = 0.75
"""What a row's running target confidence keeps per step (the last ~4 steps count)."""

TARGET_CALIBRATION_STRENGTH = 8.0
"""Pseudo-counts of the first position's forecast in each bin of the target-confidence
calibration (as a row's own acceptance has: GoodputPolicy.strength). Only drafting steps teach
it, so its outer bins see few: with 2, one rejection in a bin no step had reached set every row
there to 0.47 where the batch-wide forecast was 0.7 (8: 0.62). At batch 4 on 32 training prompts
rows at 0.50 from such bins, one enough in a finishing batch, kept whole batches from drafting,
where the bins' measured acceptance lay between 0.63 and 0.83 (BENCHMARKS §10.29)."""

RESUME_HORIZON = 16
"""The most steps a row that resumes drafting is expected to go on drafting, and the guess
before any drafting spell has ended: the one-time cost of catching its drafter up is charged to
a plan at 1/horizon of it per step (GoodputController.horizon, also a start's before any request
that drafted has ended; untuned)."""


class AcceptanceByPosition:
    """Exponentially weighted acceptance of each draft position: a_i = P(accept i | accepted
    1..i−1), counted over the steps that verified position i (positions after the first
    rejection were not tested and count for nothing). Each update first multiplies the old
    counts by `memory`, so a row that stops drafting drifts back to its prior."""

    def __init__(self, memory: float) -> None:
        require(0.0 <= memory < 1.0, f"acceptance memory must be in [0, 1), got {memory}")
        self.memory = memory
        self.accepted: list[float] = []
        self.tested: list[float] = []

    def tested_at(self, index: int) -> float:
        """Weighted count of steps that verified position index + 1."""
        return self.tested[index] if index < len(self.tested) else 0.0

    def fade(self, factor: float) -> None:
        """Keep `factor` of every count: older evidence weighs less against the prior."""
        self.accepted = [x * factor for x in self.accepted]
        self.tested = [x * factor for x in self.tested]

    def add(self, verified: int, accepted: int) -> None:
        self.fade(self.memory)
        for i in range(min(verified, accepted + 1)):
            if i == len(self.tested):
                self.accepted.append(0.0)
                self.tested.append(0.0)
            self.tested[i] += 1.0
            self.accepted[i] += float(i < accepted)

    def estimates(self, length: int, prior: Sequence[float] | None, strength: float) -> list[float]:
        """a_1..a_length, each shrunk towards its prior with `strength` pseudo-steps; without a
        prior list, towards the estimate of the position before (the first: PRIOR_ACCEPTANCE)."""
        out: list[float] = []
        for i in range(length):
            base = prior[i] if prior is not None else (out[-1] if out else PRIOR_ACCEPTANCE)
            seen = self.tested[i] if i < len(self.tested) else 0.0
            hits = self.accepted[i] if i < len(self.accepted) else 0.0
            out.append((hits + strength * base) / (seen + strength))
        return out


class ConfidenceCalibration:
    """Acceptance as a function of a confidence (the draft's or the target's top probability at
    temperature 1) in `bins` equal bins over [0, 1], exponentially weighted over all rows, each
    bin shrunk towards the position forecast with `strength` pseudo-counts."""

    def __init__(self, bins: int = 10, memory: float = 0.995, strength: float = 2.0) -> None:
        self.bins, self.memory, self.strength = bins, memory, strength
        self.accepted = [0.0] * bins
        self.tested = [0.0] * bins

    def _bin(self, confidence: float) -> int:
        return min(int(confidence * self.bins), self.bins - 1)

    def add(self, confidence: float, accepted: bool) -> None:
        self.accepted = [x * self.memory for x in self.accepted]
        self.tested = [x * self.memory for x in self.tested]
        b = self._bin(confidence)
        self.tested[b] += 1.0
        self.accepted[b] += float(accepted)

    def _in_bin(self, b: int, prior: float) -> float:
        return (self.accepted[b] + self.strength * prior) / (self.tested[b] + self.strength)

    def acceptance(self, confidence: float, prior: float) -> float:
        return self._in_bin(self._bin(confidence), prior)

    def highest(self, prior: float) -> float:
        """The most any confidence can make of `prior`: the best bin's acceptance."""
        return max(self._in_bin(b, prior) for b in range(self.bins))


@dataclass
class GoodputPolicy:
    """A row's draft policy under the controller: drafts up to the budget the controller gives
    it (at most `max_k`) and keeps the row's own acceptance by position (`memory` per step,
    `strength` pseudo-steps of the batch-wide estimate as its prior). Both are long: a request's
    text sets its level, but a rejection does not predict the next (with the 0.5B draft,
    position 1 was accepted 79 % of the time after a rejection, 71 % after an acceptance, on six
    training prompts), so a row that stopped at its first rejections lost to constant k = 1.

    Drafter confidence: before drawing each token from draft logits, the acceptance it forecasts
    is refined by the draft's confidence there (ConfidenceCalibration), and drafting stops when
    the position's expected gain (the chance of reaching it times that acceptance) falls below
    what the controller says a verified position must bring (`prepare`). Decided from the
    distribution before its token is drawn: lossless (docs/methods.md §1.2)."""

    max_k: int = 8
    memory: float = 0.95
    strength: float = 8.0
    acceptance: AcceptanceByPosition = field(init=False, repr=False)
    drafted_ever: bool = field(default=False, init=False, repr=False)
    """Whether this request has drafted yet (if not, its drafter has the whole prompt to read)."""
    opening: bool = field(default=True, init=False, repr=False)
    """Whether the row's next step is its request's first, whose first draft token is the
    answer's first token: forecast from the controller's opening estimate, not the row's own."""
    spell: int = field(default=0, init=False, repr=False)
    """Steps this row has drafted in a row, up to its last (0: it did not draft on it)."""
    drafted_steps: int = field(default=0, init=False, repr=False)
    """Steps this request has drafted on, over all its spells."""
    planned: bool = field(default=False, init=False, repr=False)
    """Whether a plan, not only probes, has had this request draft (`start_horizon`)."""
    probe_started: bool = field(default=False, init=False, repr=False)
    """Whether this request's first drafting step was a probe (`probe_repaid`)."""
    target_confidence: float | None = field(default=None, init=False, repr=False)
    """The target's top probability at this row's recent steps (TARGET_CONFIDENCE_MEMORY per
    step; None before any): what forecasts a row's acceptance before it drafts."""

    @property
    def drafted_last(self) -> bool:
        """Whether the controller let this row draft on its last step (its drafter is caught up)."""
        return self.spell > 0

    def __post_init__(self) -> None:
        require(1 <= self.max_k <= 64, f"goodput max_k must be in 1..64, got {self.max_k}")
        require(self.strength > 0, f"goodput strength must be > 0, got {self.strength}")
        self.reset()

    def reset(self) -> None:
        self.acceptance = AcceptanceByPosition(self.memory)
        self.spell = self.drafted_steps = 0
        self.drafted_ever = self.planned = self.probe_started = False
        self.target_confidence = None
        self.opening = True
        self.prepare([], 0.0, None)

    def prepare(
        self, forecast: Sequence[float], stop_gain: float, calibration: ConfidenceCalibration | None
    ) -> None:
        """Set by the controller before the row drafts: its forecast a_i for this step, the
        least expected gain a drafted position must bring, and the batch-wide calibration."""
        self.step_forecast = list(forecast)
        self.stop_gain = stop_gain
        self.calibration = calibration
        self.reach = 1.0
        self.confidences: list[float] = []

    def draft_budget(self) -> int:
        return self.max_k

    def admits(self, logits: torch.Tensor | None) -> bool:
        if self.calibration is None or logits is None:
            return True
        i = len(self.confidences)
        forecast = self.step_forecast or [PRIOR_ACCEPTANCE]
        confidence = top_probability(logits)
        accept = self.calibration.acceptance(confidence, forecast[min(i, len(forecast) - 1)])
        if self.reach * accept < self.stop_gain:
            return False
        self.confidences.append(confidence)
        self.reach *= accept
        return True

    def continue_drafting(self, drafted: DraftToken) -> bool:
        return True

    def observe(self, record: StepRecord) -> None:
        seen = record.target_confidence
        if seen is None:  # not read: a confidence from steps long past is not this row's now
            self.target_confidence = None
        else:
            old = seen if self.target_confidence is None else self.target_confidence
            self.target_confidence = (
                TARGET_CONFIDENCE_MEMORY * old + (1 - TARGET_CONFIDENCE_MEMORY) * seen
            )
        if not self.opening:  # the answer's first token says little of the rest (Openings)
            self.acceptance.add(record.num_verified, record.num_accepted)
        self.opening = False
        if self.calibration is not None:
            tested = min(record.num_verified, record.num_accepted + 1, len(self.confidences))
            for i in range(tested):
                self.calibration.add(self.confidences[i], i < record.num_accepted)
        self.confidences = []

    def forecast(self, prior: Sequence[float], strength: float | None = None) -> list[float]:
        """This row's a_i for as many positions as `prior` (the batch-wide a_i) gives, shrunk
        towards it with `strength` pseudo-steps (default: the policy's)."""
        return self.acceptance.estimates(len(prior), prior, strength or self.strength)


def finishing_steps(
    forecast: Sequence[float], tested: Sequence[float] | None, remaining: float, z: float
) -> list[float]:
    """Steps a row needs to emit `remaining` tokens with each budget 0..len(forecast), read at
    the standard normal quantile z of their spread, not their mean: a batch waits for its
    slowest row, and the most steps of B rows exceeds the most of their expected steps. With
    m = 1 + E[N | k] tokens a step, S = R / m + z·sd, sd² = R·Var[N | k] / m³ (the outcomes
    still to come: tokens a step vary, so steps to R do) + (R / m²)²·Var(m) (the forecast's own
    uncertainty: each a_i known as from FINISH_POOLING + n_i + 1 verified positions, n_i the
    row's own count there, `tested`; None: the forecast is exact). At batch 8 with the 0.5B
    draft constant k = 1 took 31 and 32 steps where its rows took 28.5 and 27.8 on average
    (BENCHMARKS §10.8); with a = 0.72 and no own steps this reads 31.3. Reading only the
    forecast's uncertainty (as this did first, lowering a by z·its sd), rows known from many
    steps were read at their mean: at batch 8 all eight drafted k = 1 at 0.85 acceptance for
    eight steps, and the batch lost 10 % (BENCHMARKS §10.27)."""
    steps = [float(remaining)]
    expected = second = 0.0  # E[N], E[N²]
    reach = 1.0  # P(N ≥ n)
    slopes: list[float] = []  # ∂E[N]/∂a_i for i ≤ k
    for n, a in enumerate(forecast, start=1):
        reach *= a
        expected += reach
        second += (2 * n - 1) * reach
        slopes = [slope + reach / max(b, 1e-12) for slope, b in zip(slopes, forecast, strict=False)]
        slopes.append(reach / max(a, 1e-12))
        m = 1.0 + expected
        spread = remaining * max(second - expected * expected, 0.0) / m**3
        if tested is not None:
            uncertain = sum(
                (slope * slope) * b * (1.0 - b) / (FINISH_POOLING + count + 1.0)
                for slope, b, count in zip(slopes, forecast, tested, strict=False)
            )
            spread += (remaining / (m * m)) ** 2 * uncertain
        steps.append(remaining / m + z * math.sqrt(spread))
    return steps


def finishing_quantile(rows: int) -> float:
    """z at B / (B + 1) for B rows (about where the most of B draws falls); 0 for one row."""
    return NormalDist().inv_cdf(rows / (rows + 1))


def finishing_catch_up(
    catch_up: Sequence[float], serves: Sequence[float] | None, budgets: Sequence[int], steps: float
) -> float:
    """Catch-up seconds a plan that finishes its batch in `steps` steps is charged: each drafting
    row's whole, or more for one expected to serve fewer steps than that (`serves`, None: none
    is): its whole times steps / serves. A plan's saving accrues over all its steps, but a start
    is repaid only over the steps its request goes on drafting, and where drafting is near
    break-even the controller stops within a few: at batch 8 in bf16 it started all eight rows
    (the 0.5B reading eight prompts, 0.83 s) for 8 to 13 steps of drafting, or for one, and lost
    3-7 % of plain decoding's time each time (BENCHMARKS §10.25-10.26)."""
    total = 0.0
    for q, budget in enumerate(budgets):
        if budget and catch_up[q]:
            total += catch_up[q] * (max(steps / serves[q], 1.0) if serves is not None else 1.0)
    return total


class DraftCost:
    """T_draft of a plan's budgets, learned from the drafting steps' own timings. Rows that draft
    one after another (trees, lookups): in proportion to the positions drafted in all. A joint
    drafter (chains of a draft model, DVI): one forward per drafted position over the rows still
    drafting, which costs more the more rows it serves: the 0.5B draft in bf16 took 63 ms a
    forward for one row, 81 for eight, 104 for sixteen. Timed by depth alone, the one-row probes
    of an idle spell taught that all eight rows draft for 63 ms, so the controller started them
    all, and the next probes unlearned what that step had taught (BENCHMARKS §10.27). So a joint
    drafter's curve is keyed by the rows a forward serves (a step: its mean over the step's
    forwards). Before any drafting step the cost is 0 (optimistic, so the controller tries it and
    learns); beyond the rows timed, a joint forward's grows at its slope over them (one count
    timed: flat), which put sixteen rows at 102 ms from one and eight (104 measured)."""

    def __init__(self, joint: bool, window: int, max_age: int) -> None:
        self.joint = joint
        self.curve = LatencyCurve(window=window, proportional=not joint, max_age=max_age)
        self._forwards: list[float] = []

    @property
    def timed(self) -> bool:
        return bool(self.curve.points())

    def forwards(self, rows: int) -> list[float]:
        """A joint drafter's seconds for one forward over 0, 1, ... `rows` rows (cached until
        the next sample: plans read them in their inner loops)."""
        if len(self._forwards) <= rows:
            timed = self.timed
            self._forwards = [self.curve(r) if r and timed else 0.0 for r in range(rows + 1)]
        return self._forwards

    def __call__(self, budgets: Sequence[int]) -> float:
        """Seconds of drafting these budgets (one per row; 0: the row does not draft)."""
        if not self.joint:
            return self.curve(sum(budgets))
        forwards = self.forwards(len(budgets))
        depth = max(budgets, default=0)
        return sum(forwards[sum(b >= i for b in budgets)] for i in range(1, depth + 1))

    def tally(self, rows: int) -> DraftTally:
        """Seconds of budgets of `rows` rows grown one position at a time, from none."""
        return DraftTally(self, self.forwards(rows) if self.joint else None)

    def add(self, budgets: Sequence[int], seconds: float) -> None:
        depth = max(budgets, default=0)
        if not self.joint:
            self.curve.add(sum(budgets), seconds)
        elif depth:
            self.curve.add(max(round(sum(budgets) / depth), 1), seconds / depth)
        self._forwards = []


class DraftTally:
    """T_draft of budgets that the plan searches grow one position at a time, in O(1) per
    position (a search tries up to rows × depth plans a step)."""

    def __init__(self, cost: DraftCost, forwards: list[float] | None) -> None:
        self.cost, self.forwards = cost, forwards
        self.at_depth: list[int] = []
        """Rows drafting each position (a joint forward's rows), index 0 unused."""
        self.positions = 0
        self.seconds = 0.0

    def grow(self, depth: int) -> float:
        """A row's budget has grown to `depth`: the budgets' T_draft now."""
        self.positions += 1
        if self.forwards is None:
            self.seconds = self.cost.curve(self.positions)
            return self.seconds
        while len(self.at_depth) <= depth:
            self.at_depth.append(0)
        rows = self.at_depth[depth]
        self.seconds += self.forwards[rows + 1] - self.forwards[rows]
        self.at_depth[depth] = rows + 1
        return self.seconds


class GoodputController:
    """Plans each step's per-row draft budgets (module docstring). One per engine: what it
    learns about the machine and the drafter carries over from request to request.

    `joint`: the drafter's forwards serve all drafting rows at once (a draft model or DVI
    drafting chains), one forward per position over the rows still drafting; otherwise rows draft
    one after another (eagle, dynamic trees, n-gram lookup) and the cost follows the total.
    `verify_prior`: (tokens, seconds) points of a profiled T_verify. Probes: while no row
    drafts, now and then one row drafts one token, to learn whether drafting pays now (estimates
    left alone go stale: idle steps teach nothing). The gap between probes is the probe's
    expected loss against a plain step over `probe_share` (probe_gap), so probing costs about
    that share of throughput: rare where drafting is hopeless, every step or two where it nearly
    pays (there a wrong estimate costs most), and less where probes have not led to plans.
    Until a drafting step has been timed, every step is a probe (an unknown T_draft is not
    free), and so is every step that would not draft before EXPLORE_SAMPLES first positions are
    verified, unless drafts that are always accepted would not pay either: then acceptance is
    not worth learning and a probe comes every MAX_PROBE_GAP idle steps (`_idle_before_probe`).

    The batch-wide acceptance is two estimates: a recent one (`memory` per row that drafted)
    shrunk towards a long-run one (LONG_RUN_MEMORY), and on a step where no row drafts the
    recent one forgets (IDLE_MEMORY) without learning. Without that, a spell of rejections that
    stopped drafting would be remembered until probes, one token each, outweighed it: where
    drafting pays by a small margin (the 0.5B draft at T = 0.7, batch 1) the controller drafted
    nothing on 335 of 808 steps, on prompts where constant k = 2 had 75 % of first positions
    accepted. Now a stale pessimistic spell fades to the long-run level, and drafting resumes if
    that level pays; each idle step costs nothing to learn from, so drafting stops again at
    once where the spell was real.

    Catching up: a row that did not draft on its last step first catches its drafter up, once:
    a draft model reads the whole prompt when the request first drafts (`start`), or the few
    tokens accepted meanwhile when it resumes (`resume`). Both costs are learned per row from the
    steps that pay them and charged to plans that have a row catch up (`charge`): when
    maximising tokens per second, spread over the steps they serve, so a large batch does not
    pay sixteen prompts' catch-up for one step of drafting that does not pay; whole when
    finishing a batch, and a start more when it is expected to serve fewer steps than the plan
    takes (`finishing_catch_up`). A resume serves one spell (`horizon`); a start serves every
    step its request drafts on, later spells included (`start_horizon`: requests a plan started;
    one that only probed was a test).

    Openings: a request's first step drafts the answer's first token, which a draft model
    predicts far worse than the tokens after it: with the 0.5B draft at batch 4, constant k = 1
    had it accepted on 2 of 16 requests, then 88-100 % of first positions at each of the next
    seven steps and ~70 % later (BENCHMARKS §10.12). So first steps are learned apart,
    batch-wide (`opening_acceptance`, the long-run estimate its prior), and teach neither the
    batch-wide acceptance nor the row's own: a rejected first step had read as a weak row, and
    at batch 2 a third of rows then did not draft on their second step."""

    def __init__(
        self,
        joint: bool,
        verify_prior: Iterable[tuple[float, float]] = (),
        window: int = 9,
        memory: float = 0.98,
        strength: float = 2.0,
        probe_share: float = 0.01,
    ) -> None:
        require(0 < probe_share <= 1, f"goodput probe_share must be in (0, 1], got {probe_share}")
        self.joint = joint
        self.verify = LatencyCurve(verify_prior, window, max_age=SAMPLE_AGE)
        self.draft = DraftCost(joint, window, SAMPLE_AGE)
        self.other: deque[float] = deque(maxlen=window)
        self.acceptance = AcceptanceByPosition(memory)
        self.long_run = AcceptanceByPosition(LONG_RUN_MEMORY)
        self.opening_acceptance = AcceptanceByPosition(LONG_RUN_MEMORY)
        """Acceptance at requests' first steps (Openings, above)."""
        self.opening_rows: list[bool] = []
        """Which rows of the step planned last were at their request's first step."""
        self.calibration = ConfidenceCalibration(strength=strength)
        self.target_calibration = ConfidenceCalibration(strength=TARGET_CALIBRATION_STRENGTH)
        """First-position acceptance by the row's running target confidence (`row_prior`)."""
        self.planned_confidence: list[float | None] = []
        """Each row's running target confidence when the step planned last was planned."""
        self.hopeless = False
        """Whether drafts that are always accepted would not pay either, by the last plan's
        estimates (`_idle_before_probe`): then no forecast is worth reading."""
        self.moot = False
        """Whether no target confidence could have made the last plan draft (`_confidence_moot`):
        then it is not worth reading either."""
        self.strength = strength
        self.fed_per_depth = 1.0
        """Verified tokens per unit of budget, over all budgets (the guess for a new budget)."""
        self.nodes_by_budget: dict[int, float] = {}
        """Verified tokens of a row given each budget: the budget for chains, the tree size for
        trees, less when lookups come up short or SV trims."""
        self.start: deque[float] = deque(maxlen=window)
        """Seconds of catch-up per row drafting for the first time in its request."""
        self.resume: deque[float] = deque(maxlen=window)
        """Seconds of catch-up per row resuming after steps without drafting."""
        self.spells: deque[int] = deque(maxlen=window)
        """Lengths in steps of the last drafting spells rows ended (`horizon`)."""
        self.lifetimes: deque[int] = deque(maxlen=window)
        """Steps drafted on, in all, by the last requests that drafted (`start_horizon`)."""
        self.probe_starts: deque[bool] = deque(maxlen=window)
        """Whether a plan went on to have each of the last requests a probe started draft."""
        self.probe_share = probe_share
        self.idle = 0
        self.starting = self.resuming = 0
        """Rows that start or resume drafting in the step planned last (its draft time is not
        T_draft alone)."""

    def reset(self) -> None:
        """Nothing: the machine and the drafter do not change between requests."""

    @property
    def reads_target_confidence(self) -> bool:
        """The target's confidence is read (`row_prior`) unless drafting cannot pay whatever
        the acceptance (at batch 32 in bf16 reading it for every row cost 6 ms a step, 1.8 % of
        plain decoding, where the controller drafted nothing, BENCHMARKS §10.26), or whatever
        confidence the rows show (at batch 8, 1.25 ms a step, ~0.7 %, §10.31): `moot`, which
        `hopeless` implies."""
        return not self.moot

    def retire(self, policy: DraftPolicy) -> None:
        """A row's request has ended: the spell it was drafting in ends with it (`horizon`), and
        the steps it drafted on in all are what a start served (`start_horizon`), if a plan
        started it: a request that only probes was a test, not a start a plan chose. Each request
        decodes with its own copy of the policy, so this is the only place they are seen."""
        if not isinstance(policy, GoodputPolicy):
            return
        if policy.spell:
            self.spells.append(policy.spell)
        if policy.planned:
            self.lifetimes.append(policy.drafted_steps)
        if policy.probe_started:
            self.probe_starts.append(policy.planned)

    def plan(
        self, policies: Sequence, caps: Sequence[int], remaining: Sequence[int] | None = None
    ) -> list[int]:
        """Final budgets (each 0..caps[q]) for rows whose policies and caps (the policy's budget
        within the row's room) are given; with each row's `remaining` tokens when the caller
        waits for the last row (finish_plan), else maximising tokens per second (best_plan)."""
        missing = [p for p in policies if not isinstance(p, GoodputPolicy)]
        if missing:
            raise ConfigError(
                f"the goodput controller plans with GoodputPolicy rows, got {type(missing[0])}"
            )
        caps = [max(cap, 0) for cap in caps]
        if not any(caps) or not self.verify.points():  # first time the plain step: the
            return self._remember(policies, [0] * len(caps))  # baseline of every plan
        finish = remaining is not None and len(caps) > 1
        forecasts = self.forecasts(policies, caps, finish)
        catch_up = [self.charge(policy, whole=finish) for policy in policies]
        serves = self._serves(policies) if finish else None
        probe = self._probe(forecasts, policies)
        probing = not self.draft.timed
        if probing:
            budgets, stop_gain = probe, 0.0
        else:
            mode = remaining if finish else None
            tested = None
            if finish:  # each forecast's verified count per position (finishing_steps)
                tested = [
                    [self._counted_in(policy).tested_at(i) for i in range(len(forecast))]
                    for policy, forecast in zip(policies, forecasts, strict=True)
                ]
            self.moot = self._confidence_moot(policies, caps, catch_up, mode, serves, tested)
            budgets, stop_gain = [0] * len(caps), 0.0
            if not self.moot:
                budgets, stop_gain = self._optimal(forecasts, catch_up, mode, serves, tested)
                budgets = self._deepen(budgets, caps, forecasts, catch_up, mode, serves, tested)
            self.idle = 0 if any(budgets) else self.idle + 1
            due = self._idle_before_probe(probe, forecasts, policies, catch_up, mode)
            probing = bool(self.idle and self.idle >= due)
            if probing:
                budgets, stop_gain, self.idle = probe, 0.0, 0
        for policy, forecast in zip(policies, forecasts, strict=True):
            policy.prepare(forecast, stop_gain, self.calibration)
        return self._remember(policies, budgets, probing)

    def forecasts(
        self,
        policies: Sequence[GoodputPolicy],
        caps: Sequence[int],
        finish: bool,
        most_confident: bool = False,
    ) -> list[list[float]]:
        """Each row's a_1..a_cap: the opening estimate at its request's first step, else its own
        shrunk towards the batch-wide one (`row_prior`; as if the row showed the confidence the
        calibration rates highest, if `most_confident`), with FINISH_POOLING pseudo-steps when
        plans finish a batch."""
        depth = max(caps)
        long_run = self.long_run.estimates(depth, None, self.strength)
        prior = self.acceptance.estimates(depth, long_run, self.strength)
        opening = self.opening_acceptance.estimates(depth, long_run, self.strength)
        pooling = FINISH_POOLING if finish else None
        return [
            (
                opening
                if policy.opening
                else policy.forecast(self.row_prior(prior, policy, most_confident), pooling)
            )[:cap]
            for policy, cap in zip(policies, caps, strict=True)
        ]

    def row_prior(
        self, prior: list[float], policy: GoodputPolicy, most_confident: bool = False
    ) -> list[float]:
        """The batch-wide a_i with a_1 refined by the row's running target confidence, which the
        target's own steps give before the row drafts: easy text for the target is easy for the
        draft. On the batch-4 bench's 16 prompts (constant k = 1, bf16) the first position was
        accepted 57 % of the time after steps where the target's top probability averaged below
        0.5 and 93 % above 0.95, and per request the answer's mean target confidence correlated
        0.75 with its acceptance; where drafting pays on one batch of prompts and loses on the
        next, the batch-wide estimate cannot tell them apart (BENCHMARKS §10.26)."""
        if most_confident and prior:
            return [self.target_calibration.highest(prior[0]), *prior[1:]]
        if policy.target_confidence is None or not prior:
            return prior
        first = self.target_calibration.acceptance(policy.target_confidence, prior[0])
        return [first, *prior[1:]]

    def _confidence_moot(
        self,
        policies: Sequence[GoodputPolicy],
        caps: Sequence[int],
        catch_up: Sequence[float],
        remaining: Sequence[int] | None,
        serves: Sequence[float] | None,
        tested: Sequence[Sequence[float]] | None,
    ) -> bool:
        """Whether no plan would draft even if every row showed the target confidence the
        calibration rates highest. A row's forecast grows with its prior's a_1, and a plan with
        higher forecasts drafts at least as much (exactly when maximising tokens per second; when
        finishing a batch nearly, as the spread of a row's steps read there can grow with a
        low acceptance), so then the rows' own plan drafts nothing (it is not computed), and the
        next step's reading, a pass over the vocabulary per row, could not have changed it: it
        is skipped, a probe's step included. Rows then forecast from the batch-wide estimate
        until the step after a plan could draft again, when reading resumes."""
        best = self.forecasts(policies, caps, remaining is not None, most_confident=True)
        return not any(self._optimal(best, catch_up, remaining, serves, tested)[0])

    def _serves(self, policies: Sequence[GoodputPolicy]) -> list[float] | None:
        """When plans finish a batch: the steps each row's catch-up is expected to serve, a
        start's the steps recent requests that a plan started drafted on in all
        (`start_horizon`), a resume's unbounded (charged whole, it is a few tokens' read); None
        before any such request has ended (every catch-up whole). See `finishing_catch_up`."""
        if not self.lifetimes:
            return None
        start = self.start_horizon()
        return [math.inf if policy.drafted_ever else start for policy in policies]

    def _counted_in(self, policy: GoodputPolicy) -> AcceptanceByPosition:
        """The estimate a row's forecast rests on: the opening one at its request's first step,
        else its own."""
        return self.opening_acceptance if policy.opening else policy.acceptance

    def _optimal(
        self,
        forecasts: Sequence[Sequence[float]],
        catch_up: Sequence[float],
        remaining: Sequence[int] | None,
        serves: Sequence[float] | None = None,
        tested: Sequence[Sequence[float]] | None = None,
    ) -> tuple[list[int], float]:
        """finish_plan with rows' `remaining` tokens (and what catch-ups serve, and how well
        the forecasts are known), else best_plan."""
        if remaining is not None:
            return self.finish_plan(forecasts, catch_up, remaining, serves, tested)
        return self.best_plan(forecasts, catch_up)

    def _idle_before_probe(
        self,
        probe: Sequence[int],
        forecasts: Sequence[Sequence[float]],
        policies: Sequence[GoodputPolicy],
        catch_up: Sequence[float],
        remaining: Sequence[int] | None,
    ) -> float:
        """Idle steps due before the next probe. Where even drafts that are always accepted would
        not pay (the verify curve and draft cost alone rule drafting out, as at batch 4 and up with
        the 0.5B draft on the AVX2 EPYC), acceptance is not worth learning: probe only every
        MAX_PROBE_GAP steps, to re-time drafting, once the probe's verification size is timed
        RETIME_SAMPLES times (before, at once). Otherwise at once while the batch-wide acceptance is
        unknown (EXPLORE_SAMPLES), then at probe_gap, with the probing row's catch-up spread over
        the steps it serves (`charge`, not whole, even when plans finish a batch: a probe tests
        drafting for the rest of its request and the ones after, not to finish this batch
        sooner). Priced whole, a request's first probe paid its draft model's read of the whole
        prompt as a loss: a server at concurrency 1 on the AVX2-only CPU (0.5B draft, prompt read
        817 ms, a plain step 497 ms) then probed every 158 idle steps, more than a request's 64,
        and after one request whose first position was accepted 47 % of the time (where one
        drafted token is at break-even) it drafted on none of the next three, 0.76 of constant
        k = 2 over the level (BENCHMARKS §10.20); at batch 2 in bf16, where plans finish the
        batch, a probe was due after ~110 idle steps, and after a rejected spell whole 48-token
        requests went undrafted (0.964 of constant k = 1, §10.24)."""
        # Where some confidence would make a plan draft (not `moot`), sure drafts would too.
        perfect = [[1.0] * len(forecast) for forecast in forecasts]
        self.hopeless = self.moot and not any(self._optimal(perfect, catch_up, remaining)[0])
        if self.hopeless:
            timed = self.verify.measured(len(forecasts) + round(self.nodes(1)))
            return MAX_PROBE_GAP if timed >= RETIME_SAMPLES else 0
        if self.long_run.tested_at(0) < EXPLORE_SAMPLES:
            return 0
        return self.probe_gap(probe, forecasts, [self.probe_charge(p) for p in policies])

    def probe_repaid(self) -> float:
        """The chance that a start a probe makes is repaid: that a plan goes on to have the
        request draft. Counted over the last requests a probe started, with two pseudo-requests
        that were (so before any ends, every start is taken as repaid)."""
        return (sum(self.probe_starts) + 2.0) / (len(self.probe_starts) + 2.0)

    def probe_charge(self, policy: GoodputPolicy) -> float:
        """Catch-up seconds a probe by this row is charged per step: a resume's spread over a
        spell (`horizon`); a start's spread over the steps it serves (`start_horizon`) if a plan
        goes on to draft, whole if not, weighted by `probe_repaid`. Where drafting never pays,
        each probe's start is lost whole: at batch 8 in bf16 one probe per batch of 48-token
        requests, the 0.5B reading a prompt (0.13-0.14 s), cost ~1.5 % of plain decoding's
        time where its spread price had allowed 1 % (BENCHMARKS §10.27). Where probes lead to
        plans, as at batch 2 and at concurrency 1, they stay as frequent as a start spread over
        what it serves makes them (`_idle_before_probe`)."""
        spread = self.charge(policy, whole=False)
        if not spread or policy.drafted_ever:
            return spread
        repaid = self.probe_repaid()
        return repaid * spread + (1.0 - repaid) * self.charge(policy, whole=True)

    def _deepen(
        self,
        budgets: list[int],
        caps: Sequence[int],
        forecasts: Sequence[Sequence[float]],
        catch_up: Sequence[float],
        remaining: Sequence[int] | None,
        serves: Sequence[float] | None = None,
        tested: Sequence[Sequence[float]] | None = None,
    ) -> list[int]:
        """One drafting row drafts one position past its plan while the long-run estimate has
        fewer than EXPLORE_SAMPLES tests of that position, if that position could pay: the plan
        with it always accepted must beat the plan without (`plan_value`). A position no plan
        reaches is never tested, and its forecast (the position before's, §7.3) is often low:
        with the 0.5B draft at T = 0.7 position 2 was accepted 86 % of the time after position 1
        (72 %), yet without this the controller drafted one token on 327 of 341 steps and ran 4 %
        behind k = 2 (a diagnostic run on one thread beside a training job, BENCHMARKS §10.7).
        Where even a sure position cannot pay, exploring it is a pure loss: on the AVX2-only CPU
        at batch 2, verifying 5 tokens took 555 ms against 450 for 4, and eight steps exploring
        a second token cost the first batch ~10 % (BENCHMARKS §10.19)."""
        value = None  # the plan's own, computed once a row is a candidate
        for q, (budget, cap) in enumerate(zip(budgets, caps, strict=True)):
            if 0 < budget < cap and self.long_run.tested_at(budget) < EXPLORE_SAMPLES:
                if value is None:
                    value = self.plan_value(budgets, forecasts, catch_up, remaining, serves, tested)
                deeper = [b + (r == q) for r, b in enumerate(budgets)]
                sure = list(forecasts)
                sure[q] = [*forecasts[q][:budget], 1.0]
                if self.plan_value(deeper, sure, catch_up, remaining, serves, tested) > value:
                    return deeper
        return budgets

    def plan_value(
        self,
        budgets: Sequence[int],
        forecasts: Sequence[Sequence[float]],
        catch_up: Sequence[float],
        remaining: Sequence[int] | None = None,
        serves: Sequence[float] | None = None,
        tested: Sequence[Sequence[float]] | None = None,
    ) -> float:
        """What a plan is worth by the objective plans are chosen by, higher better: tokens per
        second (best_plan), or, with rows' `remaining` tokens, minus the expected seconds until
        the last row finishes (finish_plan, its steps by `finishing_steps`); `catch_up` as each
        charges it (`charge`, `finishing_catch_up`)."""
        other = self.other_seconds()
        fed = len(budgets) + sum(self.nodes(k) for k in budgets)
        step = other + self.draft(budgets) + self.verify(fed)
        if remaining is None:
            emitted = sum(
                1.0 + expected_accepted(f, k) for f, k in zip(forecasts, budgets, strict=True)
            )
            catching_up = sum(c for c, k in zip(catch_up, budgets, strict=True) if k)
            return emitted / (step + catching_up)
        z = finishing_quantile(len(budgets))
        steps = max(
            finishing_steps(f[:k], None if tested is None else t[:k], r, z)[k]
            for f, t, r, k in zip(
                forecasts, tested or [None] * len(budgets), remaining, budgets, strict=True
            )
        )
        return -(step * steps + finishing_catch_up(catch_up, serves, budgets, steps))

    def other_seconds(self) -> float:
        """T_other: the median of a step's seconds outside drafting and the target forward."""
        return statistics.median(self.other) if self.other else 0.0

    def horizon(self) -> float:
        """Steps a row that resumes drafting is expected to draft for, paying its catch-up over
        them: the median of the spells rows ended lately, within 1..RESUME_HORIZON (that before
        any); also a start's until a request that drafted has ended (`start_horizon`). Where
        drafting is at break-even, rows that start together often stop after a step or two, and
        a start priced at 1/16 was then paid whole: at batch 8, all eight rows read their
        prompts for one step's nine tokens (BENCHMARKS §10.15)."""
        if not self.spells:
            return float(RESUME_HORIZON)
        return min(max(statistics.median(self.spells), 1.0), float(RESUME_HORIZON))

    def start_horizon(self) -> float:
        """Steps a request that starts drafting is expected to draft on, over all its spells
        (at least 1; before any request that drafted has ended, `horizon`). A start reads the
        prompt into the draft model once and serves every later spell, which resumes for a few
        tokens: priced over one spell, it was charged for each. At concurrency 1 on the AVX2-only
        CPU, after a request at break-even (spells of 3-4 steps) the next requests' starts
        (0.8-2.1 s) were charged a third of their cost per step and the requests were decoded
        plainly, where constant k = 2 paid 20 % (BENCHMARKS §10.20)."""
        if not self.lifetimes:
            return self.horizon()
        return max(statistics.median(self.lifetimes), 1.0)

    def charge(self, policy: GoodputPolicy, whole: bool) -> float:
        """Seconds a plan that has this row draft now is charged for catching its drafter up:
        whole when finishing a batch, else per step of what it serves (a start over
        `start_horizon`, a resume over `horizon`)."""
        seconds = self.catch_up(policy)
        if whole or not seconds:
            return seconds
        return seconds / (self.horizon() if policy.drafted_ever else self.start_horizon())

    def catch_up(self, policy: GoodputPolicy) -> float:
        """Seconds this row's drafter is expected to spend catching up if it drafts now (0 when
        it drafted on the last step; unknown costs count as 0, so they get measured)."""
        if policy.drafted_last:
            return 0.0
        samples = self.resume if policy.drafted_ever else self.start or self.resume
        return statistics.median(samples) if samples else 0.0

    def probe_gap(
        self, probe: Sequence[int], forecasts: Sequence[Sequence[float]], catch_up: Sequence[float]
    ) -> float:
        """Steps without drafting before this probe: what it is expected to lose, in plain
        steps (its seconds over a plain step's, less its tokens over a plain step's; by the
        current estimates, with the row's `catch_up` as given), over `probe_share` times the
        chance that what a probe starts a plan goes on to draft (`probe_repaid`), at most
        MAX_PROBE_GAP. Counted in plain steps, not as a goodput ratio: a probe costing three
        plain steps loses two of them, where 1 − its goodput ratio would say 0.67. A probe is
        worth what it can lead to: at batch 8 in bf16, where no plan followed any probe, probes
        cost 0.07-0.17 s of each batch of 48-token requests (~1-2 % of its 9 s) at the full
        share (BENCHMARKS §10.30)."""
        if not any(probe):
            return math.inf
        q = probe.index(1)
        rows = len(probe)
        other = self.other_seconds()
        plain_s = other + self.verify(rows)
        seconds = other + self.draft(probe) + catch_up[q] + self.verify(rows + self.nodes(1))
        loss = max(seconds / plain_s - (rows + forecasts[q][0]) / rows, 0.0)
        return min(loss / (self.probe_share * self.probe_repaid()), MAX_PROBE_GAP)

    @staticmethod
    def _probe(forecasts: Sequence[Sequence[float]], policies: Sequence) -> list[int]:
        """One token for one row, with no confidence stop: a row already caught up if there is
        one (its step times drafting alone), else one that only resumes (a few tokens to catch
        up, not a prompt), each time the one forecast to accept best."""
        budgets = [0] * len(forecasts)
        candidates = [q for q, forecast in enumerate(forecasts) if forecast]
        if candidates:
            chosen = max(
                candidates,
                key=lambda q: (policies[q].drafted_last, policies[q].drafted_ever, forecasts[q][0]),
            )
            budgets[chosen] = 1
        return budgets

    def _remember(self, policies: Sequence, budgets: list[int], probing: bool = False) -> list[int]:
        """Note which rows draft now, and how many of them start or resume: a step where rows
        catch up times that catch-up as well as drafting, so it teaches the catch-up cost, not
        T_draft (`observe`). Otherwise the idle spells that follow an expensive sample would make
        every probe look expensive too, and the controller would never draft again."""
        cold = [
            policy for policy, budget in zip(policies, budgets, strict=True)
            if budget > 0 and not policy.drafted_last
        ]  # fmt: skip
        self.starting = sum(not policy.drafted_ever for policy in cold)
        self.resuming = len(cold) - self.starting
        self.opening_rows = [policy.opening for policy in policies]
        self.planned_confidence = [policy.target_confidence for policy in policies]
        for policy, budget in zip(policies, budgets, strict=True):
            if policy.spell and not budget:  # it stops drafting now
                self.spells.append(policy.spell)
            policy.spell = policy.spell + 1 if budget else 0
            policy.drafted_steps += budget > 0
            policy.probe_started = policy.probe_started or (
                budget > 0 and probing and not policy.drafted_ever
            )
            policy.drafted_ever = policy.drafted_ever or budget > 0
            policy.planned = policy.planned or (budget > 0 and not probing)
        return budgets

    def best_plan(
        self, forecasts: Sequence[Sequence[float]], catch_up: Sequence[float] | None = None
    ) -> tuple[list[int], float]:
        """The budgets maximising G given each row's forecast a_1..a_cap (and which rows would
        catch up first, `catch_up` seconds charged per step each: `charge`), and the expected
        gain a drafted position must bring to pay for itself at that G (G times its marginal
        seconds; drafting stops below it, GoodputPolicy). For every total n the
        best n positions are the first n in marginal_order, so scanning that order (per common
        depth D for joint drafters) covers every candidate plan, exactly when each position
        costs the same tokens (chains; trees' costs per depth are learned, `nodes`) and no row
        catches up (with such rows, the order without them is scanned as well). Plans
        feeding the target more than twice the most tokens it was timed on are left out (the
        next step measures further)."""
        rows = len(forecasts)
        other = self.other_seconds()
        # Beyond the largest size timed, T is a guess: go at most twice as far, then measure.
        limit = 2 * self.verify.points()[-1][0]
        items = list(marginal_order(forecasts))
        deepest = max(len(f) for f in forecasts)
        extra = [0.0] + [max(self.nodes(k) - self.nodes(k - 1), 0.0) for k in range(1, deepest + 1)]
        share = list(catch_up) if catch_up else [0.0] * rows
        orders = [items]  # a catching-up row's first position costs more than its gain says, so
        if any(share):  # plans that leave every catching-up row out are scanned too
            orders.append([item for item in items if not share[item[0]]])
        best, best_depth, best_n, best_order = rows / (other + self.verify(rows)), 0, 0, items
        for order in orders:
            for depth in range(1, deepest + 1) if self.joint else (deepest,):
                counts = [0] * rows
                tally = self.draft.tally(rows)
                expected, fed, n, resuming = float(rows), float(rows), 0, 0.0
                for q, gain, _ in order:
                    if counts[q] == depth:
                        continue
                    counts[q] += 1
                    fed += extra[counts[q]]
                    if fed > limit and n >= rows:
                        break
                    n += 1
                    expected += gain
                    if counts[q] == 1:
                        resuming += share[q]
                    drafting = tally.grow(counts[q])
                    goodput = expected / (other + drafting + resuming + self.verify(fed))
                    if goodput > best:
                        best, best_depth, best_n, best_order = goodput, depth, n, order
        budgets = [0] * rows
        taken = 0
        for q, _, _ in best_order:
            if taken == best_n:
                break
            if budgets[q] < best_depth:
                budgets[q] += 1
                taken += 1
        return budgets, best * self._marginal_seconds(budgets)

    def finish_plan(
        self,
        forecasts: Sequence[Sequence[float]],
        catch_up: Sequence[float],
        remaining: Sequence[int],
        serves: Sequence[float] | None = None,
        tested: Sequence[Sequence[float]] | None = None,
    ) -> tuple[list[int], float]:
        """The budgets minimising the expected time until the batch's last row finishes, when
        the caller waits for it (docs/methods.md §7.5): a step's cost times the most steps any
        row still needs (its remaining tokens over its tokens per step, 1 + E[N], read where
        the slowest of the rows falls: `finishing_steps`, with each forecast's verified counts
        `tested`, None: exact), plus the one-time catch-up of each row that starts drafting
        (`finishing_catch_up`, with the steps each `serves`). Tokens a row that is ahead gains
        are worth nothing then, and a batch whose slowest row accepts little is better decoded
        plainly, which tokens per second (best_plan) cannot see. Candidates: from no drafting,
        add a position to the row that needs the most steps, until that row can draft no
        further. Returns the budgets and the gain a drafted position must bring (as
        best_plan's, at the bottleneck row's rate)."""
        rows = len(forecasts)
        other = self.other_seconds()
        limit = 2 * self.verify.points()[-1][0]
        emitted = [  # per row, expected tokens a step emits with budget 0, 1, ...: 1 + E[N]
            list(itertools.accumulate(itertools.accumulate(f, operator.mul), initial=1.0))
            for f in forecasts
        ]
        z = finishing_quantile(rows)
        needed = [  # per row, the steps it needs with budget 0, 1, ...
            finishing_steps(f, None if tested is None else t, r, z)
            for f, t, r in zip(forecasts, tested or [None] * rows, remaining, strict=True)
        ]
        budgets = [0] * rows
        steps = [float(r) for r in remaining]
        best = (other + self.verify(rows)) * max(steps)
        best_budgets, best_step = list(budgets), other + self.verify(rows)
        fed, added = float(rows), 0
        tally = self.draft.tally(rows)
        while True:
            q = max(range(rows), key=steps.__getitem__)
            if budgets[q] == len(forecasts[q]):
                break
            budgets[q] += 1
            fed += max(self.nodes(budgets[q]) - self.nodes(budgets[q] - 1), 0.0)
            added += 1
            if fed > limit and added > rows:
                break
            steps[q] = needed[q][budgets[q]]
            step = other + tally.grow(budgets[q]) + self.verify(fed)
            most = max(steps)
            seconds = step * most + finishing_catch_up(catch_up, serves, budgets, most)
            if seconds < best:
                best, best_budgets, best_step = seconds, list(budgets), step
        if not any(best_budgets):
            return best_budgets, 0.0
        bottleneck = max(range(rows), key=lambda r: needed[r][best_budgets[r]])
        rate = emitted[bottleneck][best_budgets[bottleneck]] / best_step
        return best_budgets, rate * self._marginal_seconds(best_budgets)

    def _marginal_seconds(self, budgets: Sequence[int]) -> float:
        """What one more drafted position adds to a step planned with these budgets: its share
        of verification (a tree adds its nodes per depth) and, for drafters whose rows draft
        one after another, one more draft unit."""
        fed = len(budgets) + sum(self.nodes(k) for k in budgets)
        seconds = (self.verify(fed) - self.verify(max(fed - 1, 1))) * self.fed_per_depth
        if not self.joint:
            units = sum(budgets)
            seconds += self.draft.curve(units) - self.draft.curve(units - 1)
        return seconds

    def nodes(self, budget: int) -> float:
        """Tokens a row with this budget is expected to have verified (a chain: the budget)."""
        if budget <= 0:
            return 0.0
        return self.nodes_by_budget.get(budget, budget * self.fed_per_depth)

    def observe(
        self,
        budgets: Sequence[int],
        records: Sequence[StepRecord],
        draft_s: float,
        verify_s: float,
        step_s: float,
    ) -> None:
        """One finished step: the budgets planned, each row's record, and the seconds spent
        drafting (with selection: SV's companion), in the target forward, and in all."""
        fed = sum(1 + record.num_nodes for record in records)
        self.verify.add(fed, verify_s)
        if self.starting or self.resuming:
            extra = max(draft_s - (self.draft(budgets) if self.draft.timed else 0.0), 0.0)
            if not self.starting:
                self.resume.append(extra / self.resuming)
            elif not self.resuming or self.resume:  # a mix: the resumes at their usual cost
                resumed = self.resuming * statistics.median(self.resume) if self.resuming else 0.0
                self.start.append(max(extra - resumed, 0.0) / self.starting)
        else:
            self.draft.add(budgets, draft_s)
        self.other.append(max(step_s - draft_s - verify_s, 0.0))
        planned = sum(budgets)
        if planned:
            ratio = sum(record.num_nodes for record in records) / planned
            self.fed_per_depth = 0.9 * self.fed_per_depth + 0.1 * ratio
        for budget, record in zip(budgets, records, strict=True):
            if budget > 0:
                known = self.nodes_by_budget.get(budget, record.num_nodes)
                self.nodes_by_budget[budget] = 0.9 * known + 0.1 * record.num_nodes
        learned = False
        rows = zip(records, self.opening_rows, self.planned_confidence, strict=True)
        for record, opening, confidence in rows:
            if not record.num_verified:  # a row that drafted nothing says nothing of the drafter
                continue
            if opening:
                self.opening_acceptance.add(record.num_verified, record.num_accepted)
                continue
            if confidence is not None:
                self.target_calibration.add(confidence, record.num_accepted > 0)
            self.acceptance.add(record.num_verified, record.num_accepted)
            self.long_run.add(record.num_verified, record.num_accepted)
            learned = True
        if not learned:  # an idle step: the recent estimate fades towards the long run
            self.acceptance.fade(IDLE_MEMORY)
