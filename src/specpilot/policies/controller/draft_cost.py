"""T_draft, the seconds of drafting a plan's budgets, learned from the drafting steps' own
timings (docs/methods.md §7.2)."""

from __future__ import annotations

from collections.abc import Sequence

from specpilot.policies.latency import LatencyCurve


class DraftCost:
    """T_draft of a plan's budgets. Rows that draft one after another (trees, lookups): in
    proportion to the positions drafted in all. A joint drafter (chains of a draft model, DVI):
    one forward per drafted position over the rows still drafting, keyed by the rows it serves,
    since a forward costs more the more rows it serves (timed by depth alone, one-row probes
    would price every row's drafting at one row's). A step teaches its mean forward. Before any
    drafting step the cost is 0 (optimistic, so the controller tries it and learns); beyond the
    rows timed, a joint forward's grows at its slope over them (one count timed: flat)."""

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
