"""Lossless verification rules (pure functions) and a slow reference used by the tests."""

from specpilot.verify.rules import verify, verify_greedy, verify_sampling

__all__ = ["verify", "verify_greedy", "verify_sampling"]
