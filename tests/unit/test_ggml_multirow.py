"""The multi-row K-quant kernels (patches/ggml, built in by install.sh): a forward over n tokens
gives bit for bit the logits of n one-token forwards, on a tiny Q4_K/Q6_K model. A library built
otherwise lacks the kernels: the tests then skip, except where SPECPILOT_REQUIRE_MULTIROW is set
(.ci/run sets it)."""

import os

import pytest
import torch

pytest.importorskip("llama_cpp")

from kquant_gguf import write_kquant_gguf  # noqa: E402

from specpilot.models.ggml import GgmlRunner  # noqa: E402
from specpilot.models.ggml.config import GgmlConfig  # noqa: E402
from specpilot.models.ggml.library import multirow_kernels  # noqa: E402

EXACT = GgmlConfig(n_threads=2, flash_attn=False, kv_type="f32", repack=False)


@pytest.fixture(scope="module")
def kquant_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("kquant") / "tiny-q4_k_m.gguf"
    write_kquant_gguf(path)
    return path


def require_kernels():
    if os.environ.get("SPECPILOT_REQUIRE_MULTIROW"):
        assert multirow_kernels(), "install.sh did not build the multi-row kernels"
    elif not multirow_kernels():
        pytest.skip("this llama-cpp-python was not built by install.sh (no multi-row kernels)")


@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
def test_n_rows_equal_n_single_forwards(kquant_path, n):
    require_kernels()
    runner = GgmlRunner(kquant_path, max_length=128, config=EXACT)
    prompt = [5 + (7 * i) % 80 for i in range(20)]
    tokens = [10 + (13 * i) % 80 for i in range(n)]
    runner.forward(prompt, logits="none")
    together = runner.forward(tokens, logits="all")
    runner.rollback(len(prompt))
    one_by_one = torch.cat([runner.forward([token], logits="all") for token in tokens])
    assert torch.isfinite(together).all() and together.abs().max() > 0
    assert torch.equal(together, one_by_one)
