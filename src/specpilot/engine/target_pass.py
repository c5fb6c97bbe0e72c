"""The target's forwards in the decode loop, and what a drafter takes from them.

`TargetPass` runs one target forward over every row's new tokens (the prefill's prompt pieces,
a step's root and drafted tokens) and returns each row's logits. A feature drafter (EAGLE) reads
the target's hidden states from those same forwards, so it never costs a target pass of its own:
`FeaturePass` taps its layers and, once the loop knows which positions were committed, hands it
their taps. The loop calls both alike, so it knows nothing of features.
"""

from __future__ import annotations

import torch

from specpilot.drafting.base import FeatureDrafter
from specpilot.errors import ConfigError
from specpilot.models.runner import CausalRunner


class TargetPass:
    """The target's forward, for a drafter that reads only tokens."""

    def __init__(self, target: CausalRunner):
        self.target = target

    def reusable(self, slot: int, prompt_ids: list[int]) -> int:
        """Leading prompt tokens `slot` holds (what a prefill there can skip)."""
        return self.target.cached.reusable(slot, prompt_ids[:-1])

    def trim(self, slot: int, prompt_ids: list[int]) -> None:
        """Before a prefill: drop what `slot` holds that this pass cannot reuse (nothing here)."""

    def forward(
        self,
        rows: list[list[int]],
        slots: list[int],
        logits: str,
        trees: list[tuple[int, ...] | None] | None = None,
    ) -> list[torch.Tensor | None]:
        """One forward over each row's new tokens in its slot (`trees`: each row's parent
        indices, None a chain); per row its logits (`logits` "all" or "none")."""
        return self.target.forward_batch(rows, slots, logits, **self._tree_options(trees))

    def commit(
        self, row: int, slot: int, start: int, tokens: list[int], path: tuple[int, ...] | None
    ) -> None:
        """Row `row` of the last forward committed `tokens` at positions start.. of `slot`: the
        fed tokens in order (`path` None) or the root and the accepted tree `path`."""

    def _tree_options(self, trees) -> dict:
        if trees is None or all(tree is None for tree in trees):
            return {}
        if not getattr(self.target, "supports_trees", False):
            raise ConfigError(
                "this drafter proposes trees, which the target's runner cannot verify: "
                "serve the target with the lean decoder backend (Llama/Qwen2 family) or "
                "draft chains"
            )
        return {"trees": trees}


class FeaturePass(TargetPass):
    """The target's forward tapping a feature drafter's layers, whose taps at the committed
    positions it hands to the drafter. Invariant: a slot's features cover exactly the
    positions the target's cache holds."""

    def __init__(self, target: CausalRunner, drafter: FeatureDrafter):
        super().__init__(target)
        self.drafter = drafter
        self.features: list[torch.Tensor | None] = []
        """Per row of the last forward, its taps concatenated ([n, layers · hidden])."""

    def reusable(self, slot: int, prompt_ids: list[int]) -> int:
        return min(super().reusable(slot, prompt_ids), self.drafter.reusable(slot, prompt_ids))

    def trim(self, slot: int, prompt_ids: list[int]) -> None:
        """Keep no more of the target's cache than the drafter has features for (another
        engine may have used the target since)."""
        self.target.rollback(self.drafter.reusable(slot, prompt_ids), slot=slot)

    def forward(self, rows, slots, logits, trees=None):
        layers = self.drafter.feature_layers
        outs = self.target.run_batch(
            rows, slots, logits=logits, tap_layers=layers, **self._tree_options(trees)
        )
        self.features = [out and torch.cat([out.taps[k] for k in layers], dim=-1) for out in outs]
        return [out and out.logits for out in outs]

    def commit(self, row, slot, start, tokens, path):
        features = self.features[row]
        if features is None:  # nothing was fed
            return
        if path is not None:
            features = features[[0, *(1 + i for i in path)]]
        self.drafter.take_features(slot, start, features[: len(tokens)], tokens)


def default_target_pass(target: CausalRunner, drafter) -> TargetPass:
    """The pass for this drafter (a FeaturePass for a FeatureDrafter)."""
    if isinstance(drafter, FeatureDrafter):
        return FeaturePass(target, drafter)
    return TargetPass(target)
