"""drafting.eagle3_format: our head as a public EAGLE-3 checkpoint (vLLM / SGLang / llama.cpp)
and back: tensor names, shapes and dtypes as the format has them; export → import gives the
same weights and the same greedy float32 decoding; a head written by the test in the public
layout (vLLM's or SGLang's layer ids, an embedded copy of the target's embedding, draft ids in
another order) loads and drafts like the original; what specpilot cannot run is refused."""

from __future__ import annotations

import json

import pytest
import torch
from eagle_fixtures import WORDS, tiny_head, tiny_target
from safetensors.torch import load_file, save_file
from tiny import TinyTokenizer, tiny_tokenizer

from specpilot.config import GenerationConfig
from specpilot.drafting.eagle import EagleDrafter
from specpilot.drafting.eagle3_format import ROPE_KEYS, export_eagle3, import_eagle3
from specpilot.drafting.eagle_head import EagleShape
from specpilot.engine import SpeculativeEngine
from specpilot.errors import ConfigError
from specpilot.models.decoder import DecoderRunner
from specpilot.policies import ConstantPolicy

PROMPTS = [[1, 5, 9, 14, 20, 7], [1, 33, 44], [1, 60, 61, 62, 63]]


@pytest.fixture(scope="module")
def model():
    return tiny_target(torch.float32)


@pytest.fixture(scope="module")
def runner(model):
    return DecoderRunner(model)


@pytest.fixture(scope="module", params=[True, False], ids=["qkv-bias", "no-bias"])
def head(request, runner):
    head = tiny_head(runner, draft_vocab=48)
    if not request.param:
        bias_free = type(head)(
            EagleShape(**{**head.shape.__dict__, "attention_bias": False}), head.draft_ids
        )
        state = {k: v for k, v in head.state_dict().items() if k != "qkv_bias"}
        bias_free.load_state_dict(state)
        head = bias_free
    ids = torch.randperm(96, generator=torch.Generator().manual_seed(1))[:48].sort().values
    head.draft_ids.copy_(ids)  # not a prefix: d2t offsets differ per row
    return head.float()


def target_shape(runner) -> EagleShape:
    return EagleShape.for_target(runner, tiny_tokenizer(WORDS[: runner.vocab_size - 4]))


def decode(model, head) -> list[list[int]]:
    runner = DecoderRunner(model)
    engine = SpeculativeEngine(
        runner, TinyTokenizer(), EagleDrafter(runner, head, depth=4, topk=1, nodes=1),
        ConstantPolicy(4), eos_ids=set(),
    )  # fmt: skip
    return [engine.generate(p, GenerationConfig(max_new_tokens=20)).token_ids for p in PROMPTS]


def test_names_shapes_and_dtypes_follow_the_format(tmp_path, model, head):
    export_eagle3(head, model.config.to_dict(), tmp_path, torch.bfloat16)
    s = head.shape
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1 and config["tie_word_embeddings"] is False
    assert config["draft_vocab_size"] == 48 and config["vocab_size"] == 96
    assert config["attention_bias"] is s.attention_bias
    target = model.config.to_dict()
    rope = [key for key in ROPE_KEYS if key in target]
    assert rope and all(config[key] == target[key] for key in rope)
    assert config["eagle_aux_hidden_state_layer_ids"] == list(s.feature_layers)
    sglang = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert sglang == [k - 1 for k in s.feature_layers]
    h, q, kv = s.hidden_size, s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    i = s.intermediate_size
    shapes = {
        "fc.weight": (h, h * len(s.feature_layers)),
        "midlayer.self_attn.q_proj.weight": (q, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.mlp.gate_proj.weight": (i, h),
        "midlayer.mlp.up_proj.weight": (i, h),
        "midlayer.mlp.down_proj.weight": (h, i),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "norm.weight": (h,),
        "lm_head.weight": (48, h),
        "d2t": (48,),
        "t2d": (96,),
    }
    if s.attention_bias:
        shapes |= {
            f"midlayer.self_attn.{n}_proj.bias": (d,)
            for n, d in zip("qkv", (q, kv, kv), strict=True)
        }
        shapes["midlayer.self_attn.o_proj.bias"] = (h,)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert {name: tuple(t.shape) for name, t in tensors.items()} == shapes
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert all(t.dtype == torch.bfloat16 for n, t in tensors.items() if n not in ("d2t", "t2d"))
    ids = torch.arange(48) + tensors["d2t"]
    assert torch.equal(ids, head.draft_ids) and int(tensors["t2d"].sum()) == 48
    assert torch.equal(tensors["t2d"].nonzero().flatten(), head.draft_ids)


def test_round_trip_gives_the_same_weights_and_greedy_output(tmp_path, model, runner, head):
    export_eagle3(head, model.config.to_dict(), tmp_path, torch.float32)
    back = import_eagle3(tmp_path, target_shape(runner), model.config.to_dict(), runner.embed)
    assert back.shape == head.shape
    mine, theirs = head.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert decode(model, back) == decode(model, head)


@pytest.mark.parametrize("layout", ["vllm", "sglang"])
def test_a_public_layout_head_loads_and_drafts_like_the_original(tmp_path, model, runner, layout):
    """Written here tensor by tensor (not by export_eagle3), draft rows shuffled, with the
    target's embedding embedded and only one engine's layer-id convention."""
    head = tiny_head(runner, draft_vocab=48).float()
    s = head.shape
    order = torch.randperm(48, generator=torch.Generator().manual_seed(2))
    ids = head.draft_ids[order]
    q, kv, i = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.intermediate_size
    qw, kw, vw = head.qkv.detach().split([q, kv, kv])
    qb, kb, vb = head.qkv_bias.detach().split([q, kv, kv])
    tensors = {
        "fc.weight": head.fc, "midlayer.input_layernorm.weight": head.embed_norm,
        "midlayer.hidden_norm.weight": head.hidden_norm,
        "midlayer.self_attn.q_proj.weight": qw, "midlayer.self_attn.k_proj.weight": kw,
        "midlayer.self_attn.v_proj.weight": vw, "midlayer.self_attn.q_proj.bias": qb,
        "midlayer.self_attn.k_proj.bias": kb, "midlayer.self_attn.v_proj.bias": vb,
        "midlayer.self_attn.o_proj.weight": head.o,
        "midlayer.post_attention_layernorm.weight": head.post_norm,
        "midlayer.mlp.gate_proj.weight": head.gate_up[:i],
        "midlayer.mlp.up_proj.weight": head.gate_up[i:],
        "midlayer.mlp.down_proj.weight": head.down, "norm.weight": head.final_norm,
        "lm_head.weight": head.lm_head[order], "embed_tokens.weight": runner.embed,
    }  # fmt: skip
    tensors = {k: v.detach().float().contiguous() for k, v in tensors.items()}
    tensors["d2t"] = ids - torch.arange(48)
    layer_ids = list(s.feature_layers)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": s.hidden_size,
        "intermediate_size": i, "num_attention_heads": s.num_heads,
        "num_key_value_heads": s.num_kv_heads, "num_hidden_layers": 1, "vocab_size": 96,
        "draft_vocab_size": 48, "rms_norm_eps": s.rms_norm_eps,
    }  # fmt: skip
    if layout == "vllm":
        config["eagle_aux_hidden_state_layer_ids"] = layer_ids
    else:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [k - 1 for k in layer_ids]}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    back = import_eagle3(tmp_path, target_shape(runner), model.config.to_dict(), runner.embed)
    assert back.shape == head.shape
    assert decode(model, back) == decode(model, head)


REFUSALS = {
    "several layers": ({"num_hidden_layers": 2}, {}, "2 decoder layers"),
    "hidden size": ({"hidden_size": 128}, {}, "hidden_size"),
    "target hidden size": ({"target_hidden_size": 4096}, {}, "target_hidden_size"),
    "norm placement": ({"norm_before_residual": True}, {}, "norm_before_residual"),
    "mlp bias": ({"mlp_bias": True}, {}, "mlp_bias"),
    "fc bias": ({}, {"fc.bias": torch.zeros(1)}, "unknown tensors fc.bias"),
    "vocabulary": ({}, {"d2t": torch.full((48,), 200)}, "outside the target's vocabulary"),
    "embedding": ({}, {"embed_tokens.weight": torch.zeros(96, 1)}, "embed_tokens differ"),
    "rope": ({"rope_parameters": {"rope_type": "default", "rope_theta": 1.0}}, {}, "rope_param"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_what_specpilot_cannot_run_is_refused_with_one_message(tmp_path, model, runner, case):
    head = tiny_head(runner, draft_vocab=48).float()
    export_eagle3(head, model.config.to_dict(), tmp_path, torch.float32)
    config_change, tensor_change, message = REFUSALS[case]
    config = json.loads((tmp_path / "config.json").read_text()) | config_change
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(tmp_path / "model.safetensors"))
    if "embed_tokens.weight" in tensor_change:
        tensor_change = {"embed_tokens.weight": runner.embed.detach().clone() + 1}
    save_file(tensors | tensor_change, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match=message):
        import_eagle3(tmp_path, target_shape(runner), model.config.to_dict(), runner.embed)
