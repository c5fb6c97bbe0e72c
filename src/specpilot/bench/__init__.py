"""Benchmark harness: methods side by side on identical prompts, in one process."""
