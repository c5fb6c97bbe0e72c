"""PPOW: window-level group-relative RL fine-tuning of the feature drafter (Performance-Driven
Policy Optimization for Speculative Decoding with Adaptive Windowing)."""

from specpilot.training.ppow.config import PpowConfig
from specpilot.training.ppow.distillation import continued_distillation
from specpilot.training.ppow.trainer import train_ppow

__all__ = ["PpowConfig", "continued_distillation", "train_ppow"]
