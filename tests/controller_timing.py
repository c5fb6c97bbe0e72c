"""A goodput controller that has learned a made-up machine's timings, for unit tests."""

from __future__ import annotations

from specpilot.policies.controller import GoodputController
from specpilot.policies.sv_length import expected_accepted


def controller(
    verify, draft=lambda u: 1e-9 * u, joint=True, other=0.0, forward=None
) -> GoodputController:
    """A controller that has learned T_verify = verify(n) for n = 1..300, T_draft = draft(u)
    for u = 1..16 (a time of 0 is not a sample; joint: a forward over any rows costs draft(1))
    or, joint with `forward`, a forward over r rows forward(r) for r = 1..8, and `other`
    seconds per step."""
    c = GoodputController(joint=joint)
    for n in range(1, 301):
        c.costs.verify.add(n, verify(n))
    if forward is None:
        for u in range(1, 17):
            c.costs.draft.add([u], draft(u))
    else:
        for r in range(1, 9):
            c.costs.draft.add([1] * r, forward(r))
    c.costs.other.append(other)
    return c


def goodput(c: GoodputController, forecasts, budgets) -> float:
    """G of a plan, computed directly from its definition."""
    rows = len(budgets)
    expected = rows + sum(expected_accepted(f, k) for f, k in zip(forecasts, budgets, strict=True))
    fed = rows + sum(c.costs.nodes(k) for k in budgets)
    return expected / (c.costs.other[0] + c.costs.draft(budgets) + c.costs.verify(fed))
