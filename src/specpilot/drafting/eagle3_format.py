"""Our feature-drafter head in the public EAGLE-3 checkpoint format, both ways.

The format vLLM (`llama_eagle3.py`), SGLang (`llama_eagle3.py`) and llama.cpp
(`convert_hf_to_gguf.py`, EAGLE3 arch) load: a folder with `config.json`
(`architectures: ["LlamaForCausalLMEagle3"]`, a one-layer Llama config plus `draft_vocab_size`)
and `model.safetensors`. Our head is the same network with other tensor names:

    ours                 EAGLE-3
    fc                   fc.weight            (taps concatenated in layer order)
    embed_norm           midlayer.input_layernorm.weight   (on the next token's embedding)
    hidden_norm          midlayer.hidden_norm.weight       (on the feature; residual un-normed)
    qkv [+ qkv_bias]     midlayer.self_attn.{q,k,v}_proj.{weight,bias}   (split)
    o                    midlayer.self_attn.o_proj.weight  (+ a zero bias when q/k/v have one:
                                                            Llama's attention_bias covers o_proj)
    post_norm            midlayer.post_attention_layernorm.weight
    gate_up              midlayer.mlp.{gate,up}_proj.weight   (split)
    down                 midlayer.mlp.down_proj.weight
    final_norm, lm_head  norm.weight, lm_head.weight
    draft_ids            d2t (int64 offsets: target id = i + d2t[i]), t2d (bool mask, target ids)

Layer ids: ours, vLLM's and llama.cpp's name the input of layer k
(`eagle_aux_hidden_state_layer_ids` at the top level); SGLang reads the same key inside
`eagle_config` and captures the input of layer id + 1, so it gets ours − 1. The embedding is
the target's (never written; an imported head's own copy must equal it), rope settings are
copied from the target, and `tie_word_embeddings` is false (the draft LM head is its own).

Which engines run a head: a bias-free head (`train-eagle --no-qkv-bias`) suits vLLM, SGLang and
llama.cpp; a head with a q/k/v bias (Qwen targets, by default) runs in vLLM
(`attention_bias: true`) only: SGLang's Llama layer drops the bias and llama.cpp's EAGLE3 model
loads no bias tensors. llama.cpp 0.3.36 also needs a target whose graph records layer inputs
(Llama, Qwen3; not Qwen2): bench.llama_cpp_eagle3 has where it refuses.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specpilot.config import require
from specpilot.drafting.eagle_head import EagleHead, EagleShape, default_feature_layers
from specpilot.errors import ConfigError

ARCHITECTURE = "LlamaForCausalLMEagle3"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings")
"""Target config fields that set the head's positions; copied so the head rotates as the target."""
FROM_TARGET = ("bos_token_id", "eos_token_id", *ROPE_KEYS)
ATTENTION = ("q_proj", "k_proj", "v_proj")


def to_eagle3(head: EagleHead, target_config: dict, dtype: torch.dtype) -> tuple[dict, dict]:
    """(config.json, tensors) of `head` for a target whose HF config is `target_config`."""
    s = head.shape
    require(
        target_config.get("vocab_size") == s.vocab_size
        and target_config.get("hidden_size") == s.hidden_size,
        f"the head (vocabulary {s.vocab_size}, hidden size {s.hidden_size}) was not trained for "
        f"this target (vocabulary {target_config.get('vocab_size')}, hidden size "
        f"{target_config.get('hidden_size')})",
    )
    config = {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": s.hidden_size,
        "intermediate_size": s.intermediate_size,
        "num_attention_heads": s.num_heads,
        "num_key_value_heads": s.num_kv_heads,
        "head_dim": s.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": s.rms_norm_eps,
        "vocab_size": s.vocab_size,
        "draft_vocab_size": s.draft_vocab_size,
        "attention_bias": s.attention_bias,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "target_hidden_size": s.hidden_size,
        "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": list(s.feature_layers),
        "eagle_config": {
            "use_aux_hidden_state": True,
            "eagle_aux_hidden_state_layer_ids": [k - 1 for k in s.feature_layers],
        },
        **{key: target_config[key] for key in FROM_TARGET if key in target_config},
        "specpilot": {
            "target_model_type": s.model_type,
            "target_num_layers": s.num_layers,
            "tokenizer_fingerprint": s.tokenizer_fingerprint,
        },
    }
    rope = target_config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:  # engines on transformers 4 read it
        config["rope_theta"] = rope["rope_theta"]
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    width = s.intermediate_size
    weights = {
        "fc.weight": head.fc,
        "midlayer.input_layernorm.weight": head.embed_norm,
        "midlayer.hidden_norm.weight": head.hidden_norm,
        "midlayer.self_attn.o_proj.weight": head.o,
        "midlayer.post_attention_layernorm.weight": head.post_norm,
        "midlayer.mlp.gate_proj.weight": head.gate_up[:width],
        "midlayer.mlp.up_proj.weight": head.gate_up[width:],
        "midlayer.mlp.down_proj.weight": head.down,
        "norm.weight": head.final_norm,
        "lm_head.weight": head.lm_head,
    }
    for name, part in zip(ATTENTION, head.qkv.split([q, kv, kv]), strict=True):
        weights[f"midlayer.self_attn.{name}.weight"] = part
    if head.qkv_bias is not None:
        for name, part in zip(ATTENTION, head.qkv_bias.split([q, kv, kv]), strict=True):
            weights[f"midlayer.self_attn.{name}.bias"] = part
        weights["midlayer.self_attn.o_proj.bias"] = torch.zeros(s.hidden_size)
    tensors = {name: t.detach().to(dtype).contiguous() for name, t in weights.items()}
    ids = head.draft_ids.long()
    tensors["d2t"] = (ids - torch.arange(len(ids))).contiguous()
    t2d = torch.zeros(s.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    return config, tensors


def export_eagle3(head: EagleHead, target_config: dict, out: str | Path, dtype) -> Path:
    config, tensors = to_eagle3(head, target_config, dtype)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return out


def import_eagle3(folder: str | Path, target: EagleShape, target_config: dict, embedding=None):
    """The EAGLE-3 head in `folder` as our EagleHead for the target of shape `target` (its HF
    config `target_config`, its input embedding `embedding` to compare an embedded copy with);
    a ConfigError naming the first thing this head has that specpilot cannot run."""
    folder = Path(folder)
    if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
        raise ConfigError(f"{str(folder)!r} is no EAGLE-3 head: it needs {CONFIG} and {WEIGHTS}")
    config = json.loads((folder / CONFIG).read_text())
    config = {**config, **config.get("transformer_layer_config", {})}
    tensors = load_file(str(folder / WEIGHTS))
    _check_config(config, target, target_config)
    shape = replace(
        target,
        intermediate_size=int(config["intermediate_size"]),
        draft_vocab_size=int(config["draft_vocab_size"]),
        attention_bias="midlayer.self_attn.q_proj.bias" in tensors,
        feature_layers=_feature_layers(config, target.num_layers),
    )
    return _head(shape, tensors, embedding)


def _refuse(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(f"cannot import this EAGLE-3 head: {message}")


def _check_config(config: dict, target: EagleShape, target_config: dict) -> None:
    _refuse("draft_vocab_size" in config, "config.json has no draft_vocab_size")
    _refuse(
        config.get("num_hidden_layers", 1) == 1,
        f"it has {config.get('num_hidden_layers')} decoder layers; specpilot runs one",
    )
    wanted = {
        "hidden_size": target.hidden_size,
        "num_attention_heads": target.num_heads,
        "num_key_value_heads": target.num_kv_heads,
        "vocab_size": target.vocab_size,
    }
    if config.get("target_hidden_size") is not None:
        _refuse(
            config["target_hidden_size"] == target.hidden_size,
            f"target_hidden_size {config['target_hidden_size']} is not the target's "
            f"{target.hidden_size}",
        )
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    wanted_head_dim = {"head_dim": (head_dim, target.head_dim)}
    for key, (mine, theirs) in {
        **{k: (config.get(k), v) for k, v in wanted.items()},
        **wanted_head_dim,
    }.items():
        _refuse(mine == theirs, f"{key} {mine} differs from the target's {theirs}")
    for flag in ("norm_before_residual", "norm_before_fc", "mlp_bias"):
        _refuse(not config.get(flag), f"{flag} is set; specpilot's head has no such layout")
    _refuse(config.get("hidden_act", "silu") == "silu", "its activation is not silu")
    for key in ROPE_KEYS:
        if key in config and key in target_config and key != "max_position_embeddings":
            _refuse(
                config[key] == target_config[key],
                f"{key} {config[key]!r} differs from the target's {target_config[key]!r}",
            )
    eps = config.get("rms_norm_eps", target.rms_norm_eps)
    _refuse(abs(eps - target.rms_norm_eps) < 1e-12, f"rms_norm_eps {eps} is not the target's")


def _feature_layers(config: dict, num_layers: int) -> tuple[int, ...]:
    """Taps in our convention: vLLM's top-level ids, else SGLang's eagle_config ids + 1, else
    the engines' default (2, L/2, L − 3)."""
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        sglang = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        ids = None if sglang is None else [k + 1 for k in sglang]
    return tuple(int(k) for k in (ids or default_feature_layers(num_layers)))


def _head(shape: EagleShape, tensors: dict, embedding) -> EagleHead:
    known = _expected_names(shape) | {"d2t", "t2d", "embed_tokens.weight"}
    known |= {"midlayer.self_attn.o_proj.bias"}
    unknown = sorted(set(tensors) - known)
    _refuse(not unknown, f"unknown tensors {', '.join(unknown[:4])} (bias or extra layers?)")
    missing = sorted(_expected_names(shape) - set(tensors))
    _refuse(not missing, f"missing tensors {', '.join(missing[:4])}")
    o_bias = tensors.get("midlayer.self_attn.o_proj.bias")
    _refuse(o_bias is None or not o_bias.any(), "o_proj has a non-zero bias")
    own_embedding = tensors.get("embed_tokens.weight")
    if own_embedding is not None and embedding is not None:
        _refuse(
            torch.equal(
                tensors["embed_tokens.weight"], embedding.to(tensors["embed_tokens.weight"].dtype)
            ),
            "its embed_tokens differ from the target's embedding (another tokenizer or "
            "model?); specpilot's head uses the target's own",
        )
    if "d2t" in tensors:
        offsets = tensors["d2t"].long()
    else:  # a head over the whole vocabulary may carry no mapping
        _refuse(shape.draft_vocab_size == shape.vocab_size, "it has no d2t mapping")
        offsets = torch.zeros(shape.vocab_size, dtype=torch.long)
    _refuse(len(offsets) == shape.draft_vocab_size, "d2t does not hold draft_vocab_size ids")
    ids = torch.arange(len(offsets)) + offsets
    _refuse(
        bool(((ids >= 0) & (ids < shape.vocab_size)).all()),
        f"d2t maps draft ids outside the target's vocabulary of {shape.vocab_size}",
    )
    _refuse(len(torch.unique(ids)) == len(ids), "d2t maps two draft ids to one target id")
    if "t2d" in tensors:
        mask = torch.zeros(shape.vocab_size, dtype=torch.bool)
        mask[ids] = True
        _refuse(torch.equal(tensors["t2d"].bool(), mask), "t2d disagrees with d2t")
    order = torch.argsort(ids)  # ours lists draft ids in increasing order
    h = {name: t.float() for name, t in tensors.items() if t.is_floating_point()}
    width = shape.intermediate_size
    head = EagleHead(shape, ids[order])
    state = {
        "fc": h["fc.weight"],
        "embed_norm": h["midlayer.input_layernorm.weight"],
        "hidden_norm": h["midlayer.hidden_norm.weight"],
        "qkv": torch.cat([h[f"midlayer.self_attn.{n}.weight"] for n in ATTENTION]),
        "o": h["midlayer.self_attn.o_proj.weight"],
        "post_norm": h["midlayer.post_attention_layernorm.weight"],
        "gate_up": torch.cat(
            [h["midlayer.mlp.gate_proj.weight"], h["midlayer.mlp.up_proj.weight"]]
        ),
        "down": h["midlayer.mlp.down_proj.weight"],
        "final_norm": h["norm.weight"],
        "lm_head": h["lm_head.weight"][order],
        "draft_ids": ids[order],
    }
    if shape.attention_bias:
        state["qkv_bias"] = torch.cat([h[f"midlayer.self_attn.{n}.bias"] for n in ATTENTION])
    _refuse(width * 2 == state["gate_up"].shape[0], "gate/up rows differ from intermediate_size")
    try:
        head.load_state_dict(state)
    except RuntimeError as error:
        raise ConfigError(
            f"cannot import this EAGLE-3 head: tensor shapes differ ({error})"
        ) from None
    return head


def _expected_names(shape: EagleShape) -> set[str]:
    names = {
        "fc.weight",
        "norm.weight",
        "lm_head.weight",
        "midlayer.input_layernorm.weight",
        "midlayer.hidden_norm.weight",
        "midlayer.post_attention_layernorm.weight",
        "midlayer.self_attn.o_proj.weight",
        *(f"midlayer.mlp.{n}_proj.weight" for n in ("gate", "up", "down")),
        *(f"midlayer.self_attn.{n}.weight" for n in ATTENTION),
    }
    if shape.attention_bias:
        names |= {f"midlayer.self_attn.{n}.bias" for n in ATTENTION}
    return names
