"""γ, the draft/target cost ratio PPOW's speed reward k/(kγ+1) reads, measured on this machine."""

from __future__ import annotations

import copy
import time

import torch

from specpilot.drafting.eagle_head import EagleHead


@torch.inference_mode()
def measure_cost_ratio(runner, head: EagleHead, context: int = 128, repeats: int = 15) -> float:
    """γ: the time of one head draft step (block + draft LM head, in the target's dtype) over one
    target decode step, both one token after `context` cached positions (the fastest of
    `repeats` each: on a shared machine the minimum is the stable statistic)."""
    context = min(context, runner.max_length - 2)
    drafter = copy.deepcopy(head).to(dtype=runner.dtype)
    runner.reset()
    runner.run([i % runner.vocab_size for i in range(context)], logits="none")
    s = head.shape
    keys = torch.zeros(s.num_kv_heads, context, s.head_dim, dtype=runner.dtype)
    hidden = torch.zeros(1, s.hidden_size, dtype=runner.dtype)
    position = torch.tensor([context])

    def target_step():
        runner.run([1], logits="last")
        runner.rollback(context)

    def head_step():
        out, _, _ = drafter.block(
            hidden, hidden, runner.cos[position], runner.sin[position], keys, keys
        )
        drafter.logits(out)

    times = []
    for step in (target_step, head_step):
        for _ in range(3):  # warm-up: kernels are chosen on first use
            step()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            samples.append(time.perf_counter() - start)
        times.append(min(samples))
    runner.reset()
    return times[1] / times[0]
