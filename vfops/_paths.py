"""Checks that a folder vfops will write to can be written, before anything is written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from vfops._errors import VfopsError

__all__ = ["check_writable_folder"]


def check_writable_folder(path: str | Path, *, what: str, fix: str) -> None:
    """Raise a one-line :class:`VfopsError` (``"<what> <path> <problem>; <fix>"``) unless
    ``path`` is a folder that can be written, or one that can be created.

    Nothing is left behind: a probe folder is made and removed in ``path`` or its
    nearest existing ancestor (permission bits alone do not tell: root ignores them,
    and a read-only or virtual file system refuses whatever they say).
    """
    folder = Path(path).expanduser()
    existing = folder
    while not existing.is_dir():
        if existing.exists() or existing.is_symlink():
            where = "is" if existing == folder else f"cannot be created: {existing} is"
            kind = "a file" if existing.is_file() else "not a folder"
            raise VfopsError(f"{what} {folder} {where} {kind}, not a folder; {fix}")
        if existing.parent == existing:
            break
        existing = existing.parent
    try:
        probe = tempfile.mkdtemp(prefix=".vfops-write-check-", dir=existing)
    except OSError as exc:
        raise VfopsError(
            f"{what} {folder} cannot be written ({exc.strerror or exc}); {fix}"
        ) from None
    os.rmdir(probe)
