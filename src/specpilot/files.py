"""Atomic folder writes shared by everything that saves a model artefact (heads, checkpoints)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


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
