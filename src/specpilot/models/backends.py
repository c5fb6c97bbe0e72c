"""Which backend `auto` picks for a command's models, from what its method needs.

The ggml backend (llama.cpp over the GGUF as stored) is the fast CPU path for GGUF targets, but
its runner offers only the runner protocol's forwards, rollback, draft-tree verification and
hidden-state taps: no LM-head rows, layer-split forwards or early exits. So `auto` picks it where
the target is a GGUF (a .gguf file or an offline model) on the CPU, llama-cpp-python is
installed, and the method runs on those forwards: plain decoding, prompt lookup, a draft model's
chains or first-token trees (the draft on ggml too), the eagle drafter's chains and dynamic
trees (its head in torch, reading the target's taps and its GGUF's embedding rows) and the
draft-length policies, the goodput controller, tree-goodput, LTD (eagle's trees) and SV (its
companion an early exit written as a GGUF of its own, or another GGUF) included. DVI, the draft
model's dynamic trees and a reduced draft vocabulary stay on torch.
"""

from __future__ import annotations

from collections.abc import Mapping

from specpilot.models.ggml.files import gguf_file
from specpilot.models.ggml.library import available
from specpilot.models.offline import OFFLINE_MODELS

GGML_DRAFTERS = ("none", "model", "ngram", "eagle")
GGML_POLICIES = ("constant", "heuristic", "svip", "goodput", "tree-goodput", "ltd", "sv")
TREE_POLICIES = ("tree-goodput", "ltd")
"""Policies that always shape dynamic trees."""
TREE_DRAFTERS = ("eagle",)
"""The drafters whose dynamic trees (`tree_topk` > 1, and tree-goodput's sizing) run on ggml:
eagle's trees grow in its torch head; the draft model's need its lean decoder's tree-masked
`run`."""
TORCH_ONLY_OPTIONS = ("draft_vocab", "draft_vocab_corpus")
"""Method options that need torch weights (a draft head over some ids)."""


def runs_on_ggml(
    drafter: str, policy: str | None, options: Mapping[str, object] | None = None
) -> bool:
    """True when the method (drafter, policy name, their options) needs only the ggml runner."""
    options = options or {}
    if drafter not in GGML_DRAFTERS or (policy is not None and policy not in GGML_POLICIES):
        return False
    if any(options.get(key) is not None for key in TORCH_ONLY_OPTIONS):
        return False
    dynamic = policy in TREE_POLICIES or int(options.get("tree_topk") or 1) > 1
    return drafter in TREE_DRAFTERS or not dynamic


def choose_backend(requested: str, target: str, device: str, method_on_ggml: bool) -> str:
    """`requested` unless it is auto; auto: ggml where the module docstring says, else auto
    (models.loading's choice between the torch runners)."""
    if requested != "auto":
        return requested
    on_cpu = str(device).split(":")[0] == "cpu"
    path = gguf_file(str(target))
    is_gguf = path is not None and (path.is_file() or str(target).lower() in OFFLINE_MODELS)
    if on_cpu and method_on_ggml and is_gguf and available():
        return "ggml"
    return "auto"
