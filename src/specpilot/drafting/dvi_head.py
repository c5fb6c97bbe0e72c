"""DVI's draft head: the target's own LM head read at layer k, corrected by a trainable LoRA.

logits = s · (W_lm + (α/r)·B·A) · RMSNorm_final(h_k). W_lm and the norm are the target's
tensors, shared and frozen (the verifier stays bit-identical, which keeps DVI lossless); only A,
B and the scalar logit scale s = exp(log_scale) train (the authors' code trains one too;
docs/methods.md §3.1). The scale matters: an early exit's logits are far too peaked (on
SmolLM2-135M at layer 2, KL to the verifier is 16.9 nats at s = 1 and 5.8 at s = 1/4).

peft creates and initialises the factors (B = 0, so the untrained head is the early-exit logit
lens) and serialises them; the forward is written out here because it must score a subset of
rows (a reduced draft vocabulary) and, on CPU, stream the frozen head through `torch.mv`.

An adapter folder holds peft's `adapter_config.json` + `adapter_model.safetensors`, the scale in
`logit_scale.safetensors`, and `specpilot_dvi.json`, which records what the adapter fits (split
layer, model shape), so loading it on another model fails with a clear message instead of
silently drafting garbage.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from specpilot.config import require
from specpilot.errors import ConfigError
from specpilot.files import replace_folder
from specpilot.models.decoder import DecoderRunner
from specpilot.models.gemm import linear

META_FILE = "specpilot_dvi.json"
SCALE_FILE = "logit_scale.safetensors"
LATEST_FILE = "latest"
"""In a `train-dvi` output folder: the name of the newest checkpoint folder."""


@dataclass(frozen=True)
class LoraSettings:
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.05

    def __post_init__(self) -> None:
        require(self.rank >= 1, f"LoRA rank must be >= 1, got {self.rank}")
        require(self.alpha > 0, f"LoRA alpha must be > 0, got {self.alpha}")
        require(0 <= self.dropout < 1, f"LoRA dropout must be in [0, 1), got {self.dropout}")


@dataclass(frozen=True)
class HeadShape:
    """What an adapter was trained for; must match the model it is loaded on."""

    split: int
    hidden_size: int
    vocab_size: int
    num_layers: int
    model_type: str


class _FrozenHead(nn.Module):
    """The LM head as an nn.Linear (peft's LoRA wraps it); the weight is the target's, frozen."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.proj = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
        self.proj.weight = nn.Parameter(weight, requires_grad=False)


class DraftHead(nn.Module):
    def __init__(
        self,
        runner: DecoderRunner,
        split: int,
        lora: LoraSettings | None = None,
        token_ids: torch.Tensor | None = None,
    ):
        """`token_ids`: score only these ids (a reduced draft vocabulary), else all of them."""
        from peft import LoraConfig, get_peft_model

        super().__init__()
        require(
            1 <= split < runner.num_layers,
            f"DVI split layer must be in 1..{runner.num_layers - 1}, got {split}",
        )
        self.lora_settings = lora or LoraSettings()
        self.shape = HeadShape(
            split,
            runner.lm_head.shape[1],
            runner.vocab_size,
            runner.num_layers,
            str(runner.config.model_type),
        )
        self.eps = runner.eps
        self.norm_weight = runner.final_norm
        config = LoraConfig(
            r=self.lora_settings.rank,
            lora_alpha=self.lora_settings.alpha,
            lora_dropout=self.lora_settings.dropout,
            target_modules=["proj"],
        )
        self.peft_model = get_peft_model(_FrozenHead(runner.lm_head), config)
        self.lora = self.peft_model.base_model.model.proj
        scale_dtype = self.lora.lora_A["default"].weight.dtype
        self.log_scale = nn.Parameter(torch.zeros((), dtype=scale_dtype, device=self.device))
        self.set_token_ids(token_ids)
        self.eval()

    def set_token_ids(self, token_ids: torch.Tensor | None) -> None:
        weight = self.lora.base_layer.weight
        self.token_ids = None if token_ids is None else token_ids.to(weight.device)
        self.rows = weight if token_ids is None else weight[self.token_ids].contiguous()

    @property
    def num_scored(self) -> int:
        return self.rows.shape[0]

    @property
    def device(self) -> torch.device:
        return self.norm_weight.device

    def lora_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.peft_model.parameters() if p.requires_grad]

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [*self.lora_parameters(), self.log_scale]

    def normed(self, hidden: torch.Tensor) -> torch.Tensor:
        """RMSNorm_final(h_k) in the model's dtype, exactly as the target normalises h_L."""
        x = hidden.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.norm_weight * x.to(hidden.dtype)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden] h_k → [n, scored ids] float32 (float64 for float64 models) logits."""
        x = self.normed(hidden)
        lora_a = self.lora.lora_A["default"].weight
        lora_b = self.lora.lora_B["default"].weight
        if self.token_ids is not None:
            lora_b = lora_b[self.token_ids]
        base = linear(x, self.rows, None).to(lora_a.dtype)
        low_rank = self.lora.lora_dropout["default"](x.to(lora_a.dtype)) @ lora_a.t()
        logits = base + self.lora.scaling["default"] * (low_rank @ lora_b.t())
        return logits * self.log_scale.exp()

    # -- persistence ---------------------------------------------------------------------------
    def save(self, folder: str | Path) -> None:
        """Write the adapter (peft format + shape) atomically: a temp folder renamed into place."""
        folder = Path(folder)
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.peft_model.save_pretrained(str(tmp))
        save_file({"log_scale": self.log_scale.detach().reshape(1)}, str(tmp / SCALE_FILE))
        (tmp / META_FILE).write_text(json.dumps(asdict(self.shape), indent=1))
        replace_folder(tmp, folder)

    def load(self, path: str | Path) -> Path:
        """Load adapter weights from an adapter folder or a `train-dvi` output folder (its latest
        checkpoint); return the adapter folder used."""
        from peft.utils import set_peft_model_state_dict
        from safetensors import SafetensorError

        adapter = read_adapter(path)
        if (adapter.shape, adapter.lora) != (self.shape, self.lora_settings):
            raise ConfigError(
                f"DVI adapter {str(adapter.folder)!r} was trained for {adapter.shape}, "
                f"{adapter.lora}, but this head is {self.shape}, {self.lora_settings}; train one "
                "for this model (specpilot train-dvi) or pass the matching dvi_split",
                ("dvi_split",),
            )
        try:
            weights = load_file(str(adapter.folder / "adapter_model.safetensors"))
            log_scale = load_file(str(adapter.folder / SCALE_FILE))["log_scale"]
        except (OSError, KeyError, SafetensorError) as error:
            raise _corrupt(adapter.folder, error) from None
        with torch.no_grad():
            self.log_scale.copy_(log_scale.reshape(()))
        result = set_peft_model_state_dict(self.peft_model, weights)
        if getattr(result, "unexpected_keys", None):
            raise ConfigError(
                f"DVI adapter {str(adapter.folder)!r} holds unexpected tensors: "
                f"{result.unexpected_keys}"
            )
        return adapter.folder


@dataclass(frozen=True)
class AdapterInfo:
    folder: Path
    shape: HeadShape
    lora: LoraSettings


def _corrupt(folder: Path, error: Exception) -> ConfigError:
    return ConfigError(f"DVI adapter {str(folder)!r} is corrupt or incomplete: {error}")


def read_adapter(path: str | Path) -> AdapterInfo:
    """Where an adapter is and what it fits (split, model shape, LoRA settings), checked."""
    folder = resolve_adapter(path)
    try:
        shape = HeadShape(**json.loads((folder / META_FILE).read_text()))
        config = json.loads((folder / "adapter_config.json").read_text())
        lora = LoraSettings(config["r"], config["lora_alpha"], config["lora_dropout"])
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise _corrupt(folder, error) from None
    return AdapterInfo(folder, shape, lora)


def resolve_adapter(path: str | Path) -> Path:
    """An adapter folder, or a `train-dvi` output folder → its latest checkpoint's adapter."""
    folder = Path(path).expanduser()
    if (folder / LATEST_FILE).is_file():
        folder = folder / (folder / LATEST_FILE).read_text().strip() / "adapter"
    if not (folder / META_FILE).is_file():
        raise ConfigError(
            f"{str(path)!r} is not a DVI adapter (no {META_FILE}); pass the folder written by "
            "`specpilot train-dvi --out DIR` or one of its checkpoints",
            ("dvi_adapter",),
        )
    return folder
