"""The feature drafter's head (EAGLE-3, Li et al. 2025): one decoder block on the target's
own hidden states.

Input at position t: the target's hidden states at three layers (low, middle, high) for token
x_t, concatenated and projected 3h → h (`fuse`), joined with the target's (frozen, shared)
embedding of the next token x_{t+1}. Both are RMS-normed and concatenated (2h) into the block's
q/k/v projections; the residual stream is the fused feature. The block's output, through a final
norm and an LM head over a draft vocabulary (the most frequent target ids), predicts x_{t+2}.
Deeper draft steps feed the block its own output instead of the target's feature (EAGLE-3's
"training-time test"), which `unrolled_losses` trains for.

One module serves training (autograd, float32) and drafting (inference mode, the target's
dtype): `block` takes explicit past keys/values and an additive mask, so the caller decides what
each query sees (a causal prefix, a draft tree, the diagonal masks of training-time test).
It deliberately holds no KV cache and no target weights: `EagleDrafter` owns the cache, and the
target's embedding, rotary tables and LM head are passed in.

A head folder holds `model.safetensors` (weights and the draft→target id map) and
`eagle_config.json` (the shape it was built for, including the target's identity), so a head
trained for another target fails to load with a message naming the difference.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from specpilot.config import require
from specpilot.errors import ConfigError
from specpilot.files import ArtefactKind, replace_folder, resolve_artefact
from specpilot.models.decoder_attention import rms_norm, rope
from specpilot.models.gemm import linear

COMMITTED_HEADS = Path(__file__).resolve().parent.parent / "heads"
"""Heads shipped with the package, one folder per offline target name."""
CONFIG_FILE = "eagle_config.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT_VERSION = 1
OWN_CHOICES = ("draft_vocab_size", "feature_layers", "intermediate_size", "attention_bias")
"""EagleShape fields a head chooses; every other field must equal its target's."""
HEADS = ArtefactKind(
    "eagle head", COMMITTED_HEADS, CONFIG_FILE, "head", "eagle_head", "train-eagle", "heads"
)
"""Eagle heads: committed per offline target, or installed in the cache by `import-head`."""


def has_head(target_name: str) -> bool:
    """Whether `target_name` has a head to draft with when none is named (committed, or installed
    in the cache): where it has, the eagle drafter is the default (methods.defaults)."""
    return HEADS.default_folder(target_name) is not None


@dataclass(frozen=True)
class EagleShape:
    """What a head is built for; every field must match the target it drafts for."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    """The head's MLP width: the target's by default; narrower keeps a large target's head small
    (its MLP then starts from the target's most important units)."""
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int
    """The target's decoder layers (the feature layers index into them)."""
    vocab_size: int
    """The target's vocabulary (LM-head rows)."""
    rms_norm_eps: float
    attention_bias: bool
    """A q/k/v bias: the target's kind by default; the head's own choice (a bias-free head runs
    in more engines, drafting.eagle3_format says which)."""
    feature_layers: tuple[int, ...]
    """Tap indices: k = the input of layer k (the output of the first k layers)."""
    draft_vocab_size: int
    tokenizer_fingerprint: str
    """sha256 of the target tokenizer's vocabulary: same size but other ids is still a mismatch."""

    def __post_init__(self) -> None:
        require(len(self.feature_layers) >= 1, "a feature drafter needs at least one tap layer")
        require(
            all(1 <= k < self.num_layers for k in self.feature_layers),
            f"feature layers must lie in 1..{self.num_layers - 1}, got {self.feature_layers}",
        )
        require(self.intermediate_size >= 1, "the head's MLP width must be >= 1")
        require(
            1 <= self.draft_vocab_size <= self.vocab_size,
            f"draft vocabulary must hold 1..{self.vocab_size} ids, got {self.draft_vocab_size}",
        )

    @classmethod
    def for_target(
        cls,
        runner,
        tokenizer,
        feature_layers: tuple[int, ...] | None = None,
        draft_vocab_size: int | None = None,
        intermediate_size: int | None = None,
    ) -> EagleShape:
        """The shape of a head for a lean-decoder target (`for_config` on its config)."""
        bias = runner.layers[0].qkv_bias is not None
        return cls.for_config(
            runner.config, runner.vocab_size, tokenizer, bias,
            feature_layers, draft_vocab_size, intermediate_size,
        )  # fmt: skip

    @classmethod
    def for_config(
        cls,
        config,
        vocab_size: int,
        tokenizer,
        attention_bias: bool,
        feature_layers: tuple[int, ...] | None = None,
        draft_vocab_size: int | None = None,
        intermediate_size: int | None = None,
    ) -> EagleShape:
        """The shape of a head for a target with this transformers `config` and `vocab_size`
        LM-head rows: default taps at the inputs of layers 2, L/2 and L − 3 (low, middle, high);
        default MLP width the target's."""
        num_layers = config.num_hidden_layers
        if feature_layers is None:
            feature_layers = default_feature_layers(num_layers)
        num_heads = config.num_attention_heads
        return cls(
            model_type=config.model_type,
            hidden_size=config.hidden_size,
            intermediate_size=intermediate_size or config.intermediate_size,
            num_heads=num_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // num_heads,
            num_layers=num_layers,
            vocab_size=vocab_size,
            rms_norm_eps=config.rms_norm_eps,
            attention_bias=attention_bias,
            feature_layers=tuple(int(k) for k in feature_layers),
            draft_vocab_size=draft_vocab_size or default_draft_vocab_size(vocab_size),
            tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        )

    def mismatch(self, other: EagleShape) -> str | None:
        """The first field other than the head's own choices (OWN_CHOICES) where a head's shape
        differs from a target's, phrased for an error message; None if the head fits."""
        for f in fields(self):
            if f.name in OWN_CHOICES:
                continue
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if mine != theirs:
                what = "tokenizer" if f.name == "tokenizer_fingerprint" else f.name
                return f"{what}: head {mine!r}, target {theirs!r}"
        return None


def mlp_units(layer, keep: int) -> torch.Tensor:
    """The `keep` MLP units of a target layer that move its output most (|gate|·|up|·|down|
    column norms), in their original order: a narrower head starts from the target's main paths."""
    width = layer.down.shape[1]
    require(keep <= width, f"the head's MLP width {keep} exceeds the target's {width}")
    gate_up = layer.gate_up.float()
    score = gate_up[:width].norm(dim=1) * gate_up[width:].norm(dim=1)
    score = score * layer.down.float().norm(dim=0)
    return torch.sort(torch.topk(score, keep).indices).values


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """Inputs of layers 2, L/2 and L − 3 (EAGLE-3 fuses a low, a middle and a high layer)."""
    require(num_layers >= 4, f"a feature drafter needs a target of >= 4 layers, got {num_layers}")
    return tuple(sorted({2, num_layers // 2, num_layers - 3}))


def default_draft_vocab_size(vocab_size: int) -> int:
    """32,768 ids for large vocabularies (Qwen's 151k); the whole vocabulary up to 50k."""
    return vocab_size if vocab_size <= 50_000 else 32_768


def tokenizer_fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


class EagleHead(nn.Module):
    def __init__(self, shape: EagleShape, draft_ids: torch.Tensor):
        super().__init__()
        self.shape = shape
        h, kv = shape.hidden_size, shape.num_kv_heads * shape.head_dim
        q = shape.num_heads * shape.head_dim
        require(
            draft_ids.numel() == shape.draft_vocab_size,
            f"draft id map has {draft_ids.numel()} ids, the shape says {shape.draft_vocab_size}",
        )
        require(
            bool((draft_ids[1:] > draft_ids[:-1]).all()),
            "the draft id map must list distinct target ids in increasing order",
        )

        def weight(rows: int, cols: int) -> nn.Parameter:
            w = torch.empty(rows, cols)
            nn.init.normal_(w, std=1.0 / math.sqrt(cols))
            return nn.Parameter(w)

        self.fc = weight(h, h * len(shape.feature_layers))
        self.embed_norm = nn.Parameter(torch.ones(h))
        self.hidden_norm = nn.Parameter(torch.ones(h))
        self.qkv = weight(q + 2 * kv, 2 * h)
        self.qkv_bias = nn.Parameter(torch.zeros(q + 2 * kv)) if shape.attention_bias else None
        self.o = weight(h, q)
        self.post_norm = nn.Parameter(torch.ones(h))
        self.gate_up = weight(2 * shape.intermediate_size, h)
        self.down = weight(h, shape.intermediate_size)
        self.final_norm = nn.Parameter(torch.ones(h))
        self.lm_head = weight(shape.draft_vocab_size, h)
        self.register_buffer("draft_ids", draft_ids.long().clone(), persistent=True)

    # -- initialisation from the target ------------------------------------------------------
    @torch.no_grad()
    def init_from_target(self, runner) -> None:
        """Start from the target's own last layer, final norm and LM-head rows, with the fused
        feature equal to the high tap: the untrained head is then a (poor) copy of the target's
        top, which trains far faster from little data than a random block."""
        last = runner.layers[-1]
        h = self.shape.hidden_size
        self.qkv.zero_()
        self.qkv[:, h:] = last.qkv.float()
        if self.qkv_bias is not None:
            self.qkv_bias.copy_(last.qkv_bias.float())
        self.o.copy_(last.o.float())
        self.post_norm.copy_(last.post_norm.float())
        self.hidden_norm.copy_(last.input_norm.float())
        units = mlp_units(last, self.shape.intermediate_size)
        width = last.down.shape[1]
        self.gate_up.copy_(last.gate_up[torch.cat([units, units + width])].float())
        self.down.copy_(last.down[:, units].float())
        self.final_norm.copy_(runner.final_norm.float())
        self.lm_head.copy_(runner.lm_head[self.draft_ids].float())
        self.fc.zero_()
        self.fc[:, -h:] = torch.eye(h)

    # -- forward pieces -----------------------------------------------------------------------
    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """[n, layers · h] concatenated target taps → [n, h] fused feature."""
        return linear(taps.to(self.fc.dtype), self.fc)

    def block(
        self,
        hidden: torch.Tensor,
        embeds: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past_k: torch.Tensor | None = None,
        past_v: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One decoder block over n new positions.

        hidden, embeds: [n, h] (feature or previous output; embedding of the next token);
        cos, sin: [n, head_dim]; past_k/past_v: [kv_heads, m, head_dim] keys/values the queries
        may see (already rotated); mask: additive [n, m + n] (None: causal over past + new).
        Returns the output [n, h] and the new positions' keys/values [kv_heads, n, head_dim]."""
        s = self.shape
        n, eps = hidden.shape[0], s.rms_norm_eps
        x = torch.cat(
            [rms_norm(embeds, self.embed_norm, eps), rms_norm(hidden, self.hidden_norm, eps)], -1
        )
        qkv = linear(x, self.qkv, self.qkv_bias)
        q_size, kv_size = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        q = qkv[:, :q_size].view(n, s.num_heads, s.head_dim).transpose(0, 1)
        k = qkv[:, q_size : q_size + kv_size].view(n, s.num_kv_heads, s.head_dim).transpose(0, 1)
        v = qkv[:, q_size + kv_size :].view(n, s.num_kv_heads, s.head_dim).transpose(0, 1)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        keys = k if past_k is None else torch.cat([past_k, k], dim=1)
        values = v if past_v is None else torch.cat([past_v, v], dim=1)
        if mask is None:
            past = keys.shape[1] - n
            allowed = torch.ones(n, past + n, dtype=torch.bool, device=q.device).tril(past)
            mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device)
            mask = mask.masked_fill(~allowed, float("-inf"))
        group = s.num_heads // s.num_kv_heads
        grouped_q = q.reshape(s.num_kv_heads, group * n, s.head_dim)
        out = F.scaled_dot_product_attention(
            grouped_q[None], keys[None], values[None], attn_mask=mask.to(q.dtype).repeat(group, 1)
        )[0]
        out = out.reshape(s.num_heads, n, s.head_dim).transpose(0, 1).reshape(n, q_size)
        hidden = hidden + linear(out, self.o)
        gate, up = linear(rms_norm(hidden, self.post_norm, eps), self.gate_up).chunk(2, dim=-1)
        return hidden + linear(F.silu(gate) * up, self.down), k, v

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, h] block output → [n, draft vocab] float32 logits."""
        return linear(
            rms_norm(hidden, self.final_norm, self.shape.rms_norm_eps), self.lm_head
        ).float()

    # -- persistence ---------------------------------------------------------------------------
    def save(self, folder: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
        """Write the head atomically (a temp folder renamed into place)."""
        folder = Path(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        tensors = {
            name: (t.detach().to(dtype) if t.is_floating_point() else t.detach()).contiguous()
            for name, t in self.state_dict().items()
        }
        save_file(tensors, str(tmp / WEIGHTS_FILE))
        meta = {"format_version": FORMAT_VERSION, **asdict(self.shape)}
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=1) + "\n")
        replace_folder(tmp, folder)

    @classmethod
    def load(cls, folder: str | Path, expected: EagleShape | None = None) -> EagleHead:
        """A saved head, checked against the target's shape when `expected` is given."""
        folder = Path(folder)
        if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
            raise ConfigError(
                f"{str(folder)!r} is not an eagle head folder (it needs {CONFIG_FILE} and "
                f"{WEIGHTS_FILE}); make one with `specpilot train-eagle --out DIR`",
                ("eagle_head",),
            )
        try:
            meta = json.loads((folder / CONFIG_FILE).read_text())
            version = meta.pop("format_version", None)
            meta["feature_layers"] = tuple(meta["feature_layers"])
            shape = EagleShape(**meta)
            tensors = load_file(str(folder / WEIGHTS_FILE))
        except Exception as error:  # a corrupt file may raise anything from json/safetensors
            raise ConfigError(
                f"eagle head {str(folder)!r} is corrupt or unreadable ({error}); retrain it or "
                "restore the folder"
            ) from None
        if version != FORMAT_VERSION:
            raise ConfigError(
                f"eagle head {str(folder)!r} has format {version!r}, this specpilot reads "
                f"{FORMAT_VERSION}; retrain it with this version's `specpilot train-eagle`"
            )
        if expected is not None:
            problem = shape.mismatch(expected)
            if problem is not None:
                raise ConfigError(
                    f"eagle head {str(folder)!r} was trained for another target ({problem}); "
                    "train one for this target with `specpilot train-eagle --target NAME`",
                    ("eagle_head",),
                )
        head = cls(shape, tensors["draft_ids"])
        try:
            head.load_state_dict(
                {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}
            )
        except RuntimeError as error:
            raise ConfigError(
                f"eagle head {str(folder)!r} does not match its config: {error}"
            ) from None
        return head


def resolve_head(path: str | Path | None, target_name: str) -> Path:
    """A head folder: `path` itself, the `head/` of a train-eagle/train-ppow output folder, a
    committed head's name (`ppow` → heads/<target>-ppow, a fine-tuned head committed beside the
    target's own), or (no path) the head committed or installed for `target_name`."""
    if path is not None and not Path(path).expanduser().exists() and _is_name(path):
        committed = []
        if _is_name(target_name):  # an offline name (a target loaded from a path has none)
            named = HEADS.committed / f"{target_name}-{path}"
            if (named / CONFIG_FILE).is_file():
                return named
            committed = sorted(
                f.name.removeprefix(f"{target_name}-")
                for f in HEADS.committed.glob(f"{target_name}-*")
                if (f / CONFIG_FILE).is_file()
            )
        raise ConfigError(
            f"eagle head {str(path)!r} is neither a folder nor a head committed for "
            f"{target_name!r} (committed names: {', '.join(committed) or 'none'})"
        )
    return resolve_artefact(HEADS, path, target_name)


def _is_name(path: str | Path) -> bool:
    """A bare name like `ppow` (no folder separators), as opposed to a path."""
    text = str(path)
    return bool(text) and "/" not in text and "\\" not in text and not text.startswith(".")
