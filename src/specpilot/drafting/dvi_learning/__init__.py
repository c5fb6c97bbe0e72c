"""DVI's online learner, which the layer-split drafter runs while decoding: replay buffer, loss
terms, KL→RL schedule and the learner's settings (`train-dvi` drives the same learner offline)."""

from specpilot.drafting.dvi_learning.config import OBJECTIVES, DviTrainConfig
from specpilot.drafting.dvi_learning.learner import DviLearner

__all__ = ["OBJECTIVES", "DviLearner", "DviTrainConfig"]
