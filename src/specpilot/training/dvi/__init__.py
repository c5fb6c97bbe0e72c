"""DVI online training: replay buffer, loss terms, KL→RL schedule, learner and the train loop."""

from specpilot.training.dvi.config import OBJECTIVES, DviTrainConfig
from specpilot.training.dvi.learner import DviLearner

__all__ = ["OBJECTIVES", "DviLearner", "DviTrainConfig"]
