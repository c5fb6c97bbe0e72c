"""LTD's policy folders: the two MLPs (depth, size) as plain torch modules, and their shapes.

A folder holds `ltd_config.json` (the tree shape the observations were built for, the size
action grid, each network's hidden widths) and `depth.safetensors` and/or `size.safetensors`:
the actor of a stable-baselines3 PPO policy (its `mlp_extractor.policy_net` followed by its
`action_net`) exported as an `nn.Sequential` of Linear/ReLU layers, so inference needs neither
stable-baselines3 nor gymnasium, only torch. The critic is training-only and not kept.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from specpilot.config import require
from specpilot.errors import ConfigError
from specpilot.files import ArtefactKind, replace_folder, resolve_artefact

CONFIG_FILE = "ltd_config.json"
FORMAT = 1
COMMITTED_POLICIES = Path(__file__).resolve().parent.parent / "ltd_policies"
"""Policies trained for the offline targets, one folder per target name."""
POLICIES = ArtefactKind(
    "LTD policies", COMMITTED_POLICIES, CONFIG_FILE, "policies", "ltd_policies", "train-ltd"
)

DEPTH_REPEATS, SIZE_REPEATS = 14, 29
"""How often L/1000 and D/10 are repeated in each observation (the LTD authors' layout: it
gives the two scalars weight next to 100 resp. 1210 scores and rounds the sizes to 128, 1268)."""


@dataclass(frozen=True)
class LtdShape:
    """The tree the observations describe and the size policy's action grid."""

    topk: int = 8
    """Frontier width W of the drafter's tree (each expansion adds W² candidates)."""
    max_depth: int = 12
    """Most tree levels (the root's children are level 1)."""
    size_step: int = 10
    size_actions: int = 24
    """Size action a verifies V = size_step · (a + 1) candidates (24 × 10: the authors' code;
    12 × 20: the paper)."""

    def __post_init__(self) -> None:
        require(self.topk >= 2, f"ltd topk must be >= 2 (a tree), got {self.topk}")
        require(1 <= self.max_depth <= 64, f"ltd max_depth must be in 1..64, got {self.max_depth}")
        require(self.size_step >= 1, f"ltd size_step must be >= 1, got {self.size_step}")
        require(self.size_actions >= 1, f"ltd size_actions must be >= 1, got {self.size_actions}")

    def candidates(self, depth: int) -> int:
        """Candidates in a tree of `depth` levels: W + (depth − 1) · W²."""
        return self.topk + (depth - 1) * self.topk * self.topk

    @property
    def depth_features(self) -> int:
        return self.topk * self.topk + 2 * DEPTH_REPEATS

    @property
    def size_features(self) -> int:
        return self.candidates(self.max_depth) + 2 * SIZE_REPEATS

    def size_of(self, action: int) -> int:
        return self.size_step * (action + 1)


DEFAULT_HIDDEN = {"depth": (1024,), "size": (1024, 256)}
"""Actor widths from the LTD paper (App. A.3): depth one layer of 1024, size 1024 then 256."""


def mlp(inputs: int, hidden: tuple[int, ...], outputs: int) -> nn.Sequential:
    """Linear/ReLU layers as stable-baselines3 builds an actor (policy_net + action_net)."""
    layers: list[nn.Module] = []
    width = inputs
    for size in hidden:
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    layers.append(nn.Linear(width, outputs))
    return nn.Sequential(*layers)


@dataclass
class LtdNets:
    """A loaded policy folder: the shape and whichever of the two actors it holds."""

    shape: LtdShape
    depth: nn.Sequential | None = None
    size: nn.Sequential | None = None
    target: str | None = None

    def save(self, folder: str | Path) -> None:
        """Write the folder atomically (a reader never sees half of it)."""
        nets = {name: net for name, net in (("depth", self.depth), ("size", self.size)) if net}
        require(bool(nets), "an LTD policy folder needs a depth or a size policy")

        def write(tmp: Path) -> None:
            config = {
                "format": FORMAT,
                "target": self.target,
                "shape": asdict(self.shape),
                "hidden": {name: hidden_widths(net) for name, net in nets.items()},
            }
            (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
            for name, net in nets.items():
                state = {k: v.detach().float().contiguous() for k, v in net.state_dict().items()}
                save_file(state, str(tmp / f"{name}.safetensors"))

        folder = Path(folder)
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write(tmp)
        replace_folder(tmp, folder)

    @classmethod
    def load(cls, folder: str | Path) -> LtdNets:
        folder = Path(folder).expanduser()
        path = folder / CONFIG_FILE
        if not path.is_file():
            raise ConfigError(
                f"{folder} is not an LTD policy folder (no {CONFIG_FILE}); pass the output folder "
                "of `specpilot train-ltd` (or its policies/ folder)",
                options=("ltd_policies",),
            )
        try:
            config = json.loads(path.read_text())
            require(config.get("format") == FORMAT, f"unknown format {config.get('format')!r}")
            shape = LtdShape(**config["shape"])
            hidden = config["hidden"]
            nets = cls(shape, target=config.get("target"))
            features = {
                "depth": (shape.depth_features, 2),
                "size": (shape.size_features, shape.size_actions),
            }
            for name in hidden:
                require(name in features, f"unknown policy {name!r}")
                inputs, outputs = features[name]
                net = mlp(inputs, tuple(int(w) for w in hidden[name]), outputs)
                net.load_state_dict(load_file(str(folder / f"{name}.safetensors")))
                setattr(nets, name, net.eval().requires_grad_(False))
        except ConfigError as error:
            raise ConfigError(f"bad LTD policy folder {folder}: {error}") from None
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as error:
            detail = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ConfigError(
                f"bad LTD policy folder {folder}: {detail}; train it again with "
                "`specpilot train-ltd`"
            ) from None
        require(nets.depth is not None or nets.size is not None, f"{folder} holds no policy")
        return nets


def hidden_widths(net: nn.Sequential) -> list[int]:
    linears = [m for m in net if isinstance(m, nn.Linear)]
    return [m.out_features for m in linears[:-1]]


BACKEND_POLICIES = ("ggml",)
"""Backends with policies of their own, committed in a subfolder of the target's: trained on
that backend's cost curve (`train-ltd --backend`), whose verify costs differ from torch's."""


def resolve_policies(
    path: str | Path | None, target_name: str | None, backend: str | None = None
) -> Path:
    """A policy folder: `path` itself, the `policies/` of a train-ltd output folder, or (no path)
    the policies committed for `target_name`: on a backend of BACKEND_POLICIES its own where
    committed, else the torch ones."""
    folder = resolve_artefact(POLICIES, path, str(target_name))
    own = folder / str(backend)
    if path is None and backend in BACKEND_POLICIES and (own / POLICIES.config_file).is_file():
        return own
    return folder
