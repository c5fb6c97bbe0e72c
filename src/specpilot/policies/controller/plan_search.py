"""The plan searches: the per-row budgets that maximise tokens per second (`best_plan`), or
that finish a batch soonest when the caller waits for its last row (`finish_plan`), given each
row's forecast a_1..a_cap and what a step costs (docs/methods.md §7.1, §7.5)."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING

from specpilot.policies.controller.catch_up import finishing_catch_up
from specpilot.policies.controller.finishing import finishing_quantile, finishing_steps
from specpilot.policies.sv_length import expected_accepted, marginal_order

if TYPE_CHECKING:
    from specpilot.policies.controller.step_costs import StepCosts


def best_plan(
    costs: StepCosts,
    forecasts: Sequence[Sequence[float]],
    catch_up: Sequence[float] | None = None,
) -> tuple[list[int], float]:
    """The budgets maximising G given each row's forecast a_1..a_cap (and which rows would
    catch up first, `catch_up` seconds charged per step each: `CatchUp.charge`), and the
    expected gain a drafted position must bring to pay for itself at that G (G times its
    marginal seconds; drafting stops below it, GoodputPolicy). For every total n the best n
    positions are the first n in marginal_order, so scanning that order (per common depth D for
    joint drafters) covers every candidate plan, exactly when each position costs the same
    tokens (chains; trees' costs per depth are learned, `StepCosts.nodes`) and no row catches
    up (with such rows, the order without them is scanned as well). Plans feeding the target
    more than `StepCosts.fed_limit` tokens are left out."""
    rows = len(forecasts)
    other = costs.other_seconds()
    limit = costs.fed_limit()
    items = list(marginal_order(forecasts))
    deepest = max(len(f) for f in forecasts)
    extra = [0.0] + [max(costs.nodes(k) - costs.nodes(k - 1), 0.0) for k in range(1, deepest + 1)]
    share = list(catch_up) if catch_up else [0.0] * rows
    orders = [items]  # a catching-up row's first position costs more than its gain says, so
    if any(share):  # plans that leave every catching-up row out are scanned too
        orders.append([item for item in items if not share[item[0]]])
    best, best_depth, best_n, best_order = rows / (other + costs.verify(rows)), 0, 0, items
    for order in orders:
        for depth in range(1, deepest + 1) if costs.joint else (deepest,):
            counts = [0] * rows
            tally = costs.draft.tally(rows)
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
                goodput = expected / (other + drafting + resuming + costs.verify(fed))
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
    return budgets, best * costs.marginal_seconds(budgets)


def finish_plan(
    costs: StepCosts,
    forecasts: Sequence[Sequence[float]],
    catch_up: Sequence[float],
    remaining: Sequence[int],
    serves: Sequence[float] | None = None,
    tested: Sequence[Sequence[float]] | None = None,
) -> tuple[list[int], float]:
    """The budgets minimising the expected time until the batch's last row finishes: a step's
    cost times the most steps any row still needs (`finishing_steps`, with each forecast's
    verified counts `tested`, None: exact), plus the one-time catch-up of each row that starts
    drafting (`finishing_catch_up`, with the steps each `serves`). Tokens a row that is ahead
    gains are worth nothing then, and a batch whose slowest row accepts little is better decoded
    plainly, which tokens per second (best_plan) cannot see. Candidates: from no drafting, add
    a position to the row that needs the most steps, until that row can draft no further.
    Returns the budgets and the gain a drafted position must bring (as best_plan's, at the
    bottleneck row's rate)."""
    rows = len(forecasts)
    other = costs.other_seconds()
    limit = costs.fed_limit()
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
    best = (other + costs.verify(rows)) * max(steps)
    best_budgets, best_step = list(budgets), other + costs.verify(rows)
    fed, added = float(rows), 0
    tally = costs.draft.tally(rows)
    while True:
        q = max(range(rows), key=steps.__getitem__)
        if budgets[q] == len(forecasts[q]):
            break
        budgets[q] += 1
        fed += max(costs.nodes(budgets[q]) - costs.nodes(budgets[q] - 1), 0.0)
        added += 1
        if fed > limit and added > rows:
            break
        steps[q] = needed[q][budgets[q]]
        step = other + tally.grow(budgets[q]) + costs.verify(fed)
        most = max(steps)
        seconds = step * most + finishing_catch_up(catch_up, serves, budgets, most)
        if seconds < best:
            best, best_budgets, best_step = seconds, list(budgets), step
    if not any(best_budgets):
        return best_budgets, 0.0
    bottleneck = max(range(rows), key=lambda r: needed[r][best_budgets[r]])
    rate = emitted[bottleneck][best_budgets[bottleneck]] / best_step
    return best_budgets, rate * costs.marginal_seconds(best_budgets)


def optimal(
    costs: StepCosts,
    forecasts: Sequence[Sequence[float]],
    catch_up: Sequence[float],
    remaining: Sequence[int] | None,
    serves: Sequence[float] | None = None,
    tested: Sequence[Sequence[float]] | None = None,
) -> tuple[list[int], float]:
    """finish_plan with rows' `remaining` tokens (and what catch-ups serve, and how well the
    forecasts are known), else best_plan."""
    if remaining is not None:
        return finish_plan(costs, forecasts, catch_up, remaining, serves, tested)
    return best_plan(costs, forecasts, catch_up)


def plan_value(
    costs: StepCosts,
    budgets: Sequence[int],
    forecasts: Sequence[Sequence[float]],
    catch_up: Sequence[float],
    remaining: Sequence[int] | None = None,
    serves: Sequence[float] | None = None,
    tested: Sequence[Sequence[float]] | None = None,
) -> float:
    """What a plan is worth by the objective plans are chosen by, higher better: tokens per
    second (best_plan), or, with rows' `remaining` tokens, minus the expected seconds until
    the last row finishes (finish_plan); `catch_up` as each charges it."""
    step = costs.step_seconds(budgets)
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
