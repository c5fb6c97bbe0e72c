"""Every default of a method, defined once: the models `generate` loads, its drafter and policy,
and the sizes a drafter or policy uses when none is given."""

from __future__ import annotations

import torch

from specpilot.drafting.eagle_head import has_head
from specpilot.policies import ConstantPolicy

# The trees' levels, frontier width and verified tokens are defined with the tree.
from specpilot.tree import DEFAULT_DEPTH, DEFAULT_NODES, DEFAULT_TOPK  # noqa: F401

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
HEADLESS_DRAFTER = "model"
"""The default drafter of a target with no eagle head (`default_drafter`)."""
DEFAULT_K = ConstantPolicy().k
"""Constant k's draft length where the drafter has no natural one (a tree's depth)."""
SV_GAMMA_MAX = 5
"""Tokens SV drafts before choosing how many to verify (the paper uses 5 or 7)."""
GOODPUT_MAX_K = 8
"""The most tokens a row drafts under the goodput controller (a drafter's own depth if less)."""
EAGLE_BF16_LOOKUP = 7
"""The prompt-lookup branch an eagle tree verifies by default (`default_drafter_options`)."""
DVI_SPLIT = 2
"""DVI's split: the target's first 2 layers draft (the DVI paper's split, §4.1)."""


def default_drafter(target: str) -> str:
    """The drafter `generate`, `serve`, the bench's `default` and `build_engine` use unnamed: the
    eagle head where `target` has one (committed, or installed in the cache by `import-head`),
    else the draft model. The head drafts for ~0.2 of a target step (bf16 EPYC, ggml) and needs
    no second model to load, prefill and keep in step; with its default policy it ran 2.08x plain
    decoding on the bf16 EPYC where the draft model under its own default ran 1.275x, and on the
    ggml backend, where no drafter pays, 0.971x against the draft model's 0.973x (BENCHMARKS
    §0.2; `default_policy`)."""
    return "eagle" if has_head(target) else HEADLESS_DRAFTER


def default_policy(
    drafter: str,
    fixed_length: bool = False,
    dtype: torch.dtype | None = None,
    batch: int = 1,
    backend: str = "torch",
) -> str:
    """The policy a method runs when none is named. For the draft model, the goodput controller:
    it drafts only where this machine's measured latency and the rows' acceptance say it pays
    (greedy bf16: within 2 % of the best of plain decoding and constant k at every batch size
    1-32, where constant k lost up to 32 %; BENCHMARKS §10.13). For the eagle tree, decoding one
    sequence at a time with a target computing in float32 on the CPU (`dtype`: the target's, None
    where it is not on the CPU), `tree-goodput`: a float32 verify of the default tree's 9 tokens
    costs ~1.5 plain steps, and the constant 8-node tree ran at 1.04x plain decoding (1.5B) and
    0.79x (SmolLM2) where sizing each step's tree on the measured curve ran at 1.52x and 1.01x
    (BENCHMARKS §8.9, §8.10); it learns a one-sequence curve, so batches get the controller.
    For eagle on the ggml `backend`, at every batch size, the goodput controller: there verifying
    2 tokens costs 1.8-1.9 one-token steps, so no tree pays (hindsight ceiling of the best static
    tree 0.74x plain, BENCHMARKS §0.1) and the controller, which may draft nothing, ran at
    ≈ plain decoding where tree-goodput ran at 0.69x (§0, §0.1). For eagle decoding a batch on
    the CPU, the controller too: at batch 4 in bf16 (8 held-out AlpacaEval prompts, 48 tokens) the
    constant tree ran at 0.77x plain decoding and the controller at 1.10x (§0.2).
    For prompt lookup decoding one sequence on the ggml `backend`, the goodput controller too:
    there verifying 4 tokens costs 2.8 plain steps and constant k = 3 ran at 0.64x plain decoding
    where the controller ran at 0.97x (BENCHMARKS.md §0; batches were not measured).
    Constant where the caller asks for a `fixed_length` (a `k`, or a verify policy of its own),
    for bf16 eagle trees of one sequence (measured best constant, §8.7), eagle off the CPU (not
    measured) and for the other drafters, whose default
    depths were measured constant (prompt lookup, DVI) and are not yet measured under the
    controller."""
    if fixed_length:
        return "constant"
    if drafter == "model":
        return "goodput"
    if drafter == "eagle" and (backend == "ggml" or (dtype is not None and batch > 1)):
        return "goodput"
    if drafter == "eagle" and dtype == torch.float32 and batch == 1:
        return "tree-goodput"
    if drafter == "ngram" and backend == "ggml" and batch == 1:
        return "goodput"
    return "constant"


def default_drafter_options(
    drafter: str,
    fixed_length: bool = False,
    dtype: torch.dtype | None = None,
    batch: int = 1,
    backend: str = "torch",
) -> dict[str, int]:
    """The drafter options a method gets when it names no policy (arguments as `default_policy`;
    `backend` does not change them):
    for the eagle tree decoding one sequence with a target computing in bf16 on the CPU (where
    `default_policy` keeps the constant tree), a prompt-lookup branch of EAGLE_BF16_LOOKUP tokens.
    There verifying its extra nodes is nearly free, and the tree with it ran 1.14x the tree without
    on the Xeon (AMX-bf16, 24 held-out prompts) and 1.25x on the AVX-512-bf16 EPYC (BENCHMARKS
    §8.8, §8.11); in float32 the extra nodes cost more than they save (0.97x plain decoding, §8.9);
    batches, GPUs and a `fixed_length` were not measured with it."""
    if drafter == "eagle" and not fixed_length and dtype == torch.bfloat16 and batch == 1:
        return {"eagle_lookup": EAGLE_BF16_LOOKUP}
    return {}
