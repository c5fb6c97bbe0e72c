"""train-eagle's checkpoints (PPOW's too): the head folder plus state.pt (position, optimizer,
settings), written so that state.pt always names a complete head, and refused on resume when
the head's shape or the run's settings differ."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from specpilot.drafting.eagle_head import EagleHead, EagleShape
from specpilot.errors import ConfigError

HEAD_DIR = "head"
CHECKPOINT_DIR = "checkpoint"


def load_checkpoint(out: Path, shape: EagleShape, config: dict) -> tuple[EagleHead, dict] | None:
    """(head, state) of the run checkpointed in `out`, None if there is none; a checkpoint
    of another head shape or written with other settings (`config`, a dict) is refused rather
    than silently mixed (how often a run evaluates and saves may change)."""
    checkpoint = out / CHECKPOINT_DIR
    if not (checkpoint / "state.pt").is_file():
        return None
    head = EagleHead.load(checkpoint / HEAD_DIR, expected=shape)
    if head.shape != shape:  # the head's own choices: draft vocabulary, taps, MLP width
        raise ConfigError(
            f"{out} holds a head of another shape ({_diff(asdict(head.shape), asdict(shape))}); "
            "resume with the same options or use a new out folder",
            options=("out",),
        )
    state = torch.load(checkpoint / "state.pt", weights_only=False)
    saved, current = _training_settings(state.get("config")), _training_settings(config)
    if saved is not None and saved != current:
        raise ConfigError(
            f"{out} holds a run with other settings ({_diff(saved, current)}); "
            "resume with the same options or use a new out folder",
            options=("out",),
        )
    return head, state


def _training_settings(config: dict | None) -> dict | None:
    """The settings a resumed run must share: all but how often it evaluates and saves and
    whether it autocasts to bf16, which follows the machine it resumes on (an option added
    later with default None reads as unset in older runs)."""
    if config is None:
        return None
    skip = ("eval_every", "save_every", "bf16")
    return {k: v for k, v in config.items() if k not in skip and v is not None}


def _diff(saved: dict, current: dict) -> str:
    return ", ".join(
        f"{k}: {saved.get(k)!r} → {current.get(k)!r}"
        for k in sorted(set(saved) | set(current))
        if saved.get(k) != current.get(k)
    )


def save_checkpoint(out: Path, head: EagleHead, state: dict) -> None:
    """Head folder first, then state.pt by atomic rename: state.pt names a complete head."""
    checkpoint = out / CHECKPOINT_DIR
    head.save(checkpoint / HEAD_DIR, dtype=torch.float32)
    tmp = checkpoint / "state.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(checkpoint / "state.pt")
