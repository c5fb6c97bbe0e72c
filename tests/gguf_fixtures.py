"""Tiny GGUF files written in the test from the tiny torch models (tests/tiny.py): the same
weights in float32, so the ggml backend can be compared with the torch runner exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specpilot.models.ggml.config import GgmlConfig


def write_tiny_qwen2_gguf(path, model) -> list[str]:
    """Write `model` (a tiny Qwen2) as an F32 GGUF with a byte-level BPE tokenizer; return tokens.

    Qwen2 is stored by llama.cpp without the q/k row permutation used for the llama arch, so the
    weights go in as they are. Printable ASCII characters are their own byte-level spelling.
    """
    import gguf

    config = model.config
    printable = [chr(c) for c in range(33, 127) if chr(c) not in "ab"]
    tokens = (["<pad>", "<s>", "</s>", "ab", "a", "b"] + printable)[: config.vocab_size]
    assert len(tokens) == config.vocab_size >= 6
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    names = {
        "model.embed_tokens": "token_embd",
        "model.norm": "output_norm",
        "lm_head": "output",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for key, tensor in model.state_dict().items():
        stem, leaf = key.rsplit(".", 1)
        if stem.startswith("model.layers."):
            _, _, index, module = stem.split(".", 3)
            name = f"blk.{index}.{names[module]}.{leaf}"
        else:
            name = f"{names[stem]}.{leaf}"
        writer.add_tensor(name, tensor.detach().float().cpu().numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tokens


EXACT = GgmlConfig(n_threads=1, flash_attn=False, kv_type="f32")
"""float32 attention and KV cache: the ggml runner's logits then equal the torch runner's."""


def ggml_runner(model, path, max_length: int = 256, batch_size: int = 1):
    """A GgmlRunner over `model`, written as a float32 GGUF at `path` unless already there."""
    from specpilot.models.ggml import GgmlRunner

    path = Path(path)
    if not path.is_file():
        write_tiny_qwen2_gguf(path, model)
    return GgmlRunner(path, max_length, batch_size, EXACT)
