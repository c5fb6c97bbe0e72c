"""Model artefacts on disk (heads, policies, checkpoints): atomic folder writes, and finding the
folder a command-line flag names."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from specpilot.errors import ConfigError


def cache_root() -> Path:
    """Cache folder: $SPECPILOT_CACHE, else ~/.cache/specpilot (read on every call, for tests)."""
    env = os.environ.get("SPECPILOT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specpilot"


def file_name(text: str) -> str:
    """`text` as one file or folder name: characters other than letters, digits, "-", "_" and
    "." become "_" (a model path or hub id names a cache entry)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


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
    cache_subfolder: str | None = None
    """Where under the cache (`cache_root`) a folder installed for a target lives
    (`import-head` installs heads there); None: this kind is only committed or named."""

    def installed(self, target_name: str) -> Path:
        """The cache folder an artefact installed for `target_name` lives in."""
        if self.cache_subfolder is None:
            raise ValueError(f"{self.what}s are not installed in the cache")
        return cache_root() / self.cache_subfolder / file_name(str(target_name).strip("/"))

    def default_folder(self, target_name: str) -> Path | None:
        """The folder used when none is named: the one committed for `target_name`, else the one
        installed in the cache for it, else None."""
        candidates = [self.committed / str(target_name)]
        if self.cache_subfolder is not None:
            candidates.append(self.installed(target_name))
        return next((f for f in candidates if (f / self.config_file).is_file()), None)


def resolve_artefact(kind: ArtefactKind, path: str | Path | None, target_name: str) -> Path:
    """The folder `path` names (itself, or the finished artefact inside a training --out
    folder), or with no path the one committed or installed for `target_name`
    (`ArtefactKind.default_folder`)."""
    if path is None:
        folder = kind.default_folder(target_name)
        if folder is None:
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
