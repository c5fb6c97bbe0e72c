"""Model artefacts on disk (heads, policies, checkpoints): atomic folder writes, and finding the
folder a command-line flag names."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from specpilot.errors import ConfigError


def replace_folder(tmp: Path, folder: Path) -> None:
    """Move a finished temp folder to `folder`, replacing an older one (rename is atomic)."""
    if folder.exists():
        old = folder.with_name(folder.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old)
    else:
        os.replace(tmp, folder)


@dataclass(frozen=True)
class ArtefactKind:
    """A kind of trained folder a flag can name (an eagle head, LTD policies)."""

    what: str
    """As an error message names it, e.g. "eagle head"."""
    committed: Path
    """Folders shipped with the package, one per offline target name."""
    config_file: str
    """The file that marks a folder of this kind."""
    subfolder: str
    """Where the training command's --out folder keeps the finished artefact."""
    option: str
    """The API argument that names a folder of this kind, e.g. "eagle_head"."""
    train_command: str


def resolve_artefact(kind: ArtefactKind, path: str | Path | None, target_name: str) -> Path:
    """The folder `path` names (itself, or the finished artefact inside a training --out
    folder), or with no path the one committed for `target_name`."""
    if path is None:
        folder = kind.committed / str(target_name)
        if not (folder / kind.config_file).is_file():
            raise ConfigError(
                f"no {kind.what} committed for {target_name!r}; make one with `specpilot "
                f"{kind.train_command} --target {target_name} --out DIR` and pass DIR as "
                f"{kind.option}",
                (kind.option,),
            )
        return folder
    folder = Path(path).expanduser()
    inner = folder / kind.subfolder
    if not (folder / kind.config_file).is_file() and (inner / kind.config_file).is_file():
        return inner
    if not folder.exists():
        raise ConfigError(f"{kind.what} not found: {folder}", (kind.option,))
    return folder
