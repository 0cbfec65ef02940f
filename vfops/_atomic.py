"""Files that appear whole or not at all: written beside their place under a temporary
name, synced, renamed over the old one, and the folder synced.

A process killed at any point (``kill -9``, a lost machine) then leaves either the
previous file or the new one, never a torn one under the real name; at most a
temporary file stays behind (:func:`remove_stale`), which no reader looks at.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "fsync_dir",
    "fsync_file",
    "publish",
    "remove_stale",
    "replace_file_atomically",
    "temp_beside",
    "written_beside",
]

_TEMP_SUFFIX = ".tmp"


def fsync_file(path: Path) -> None:
    """Push ``path``'s bytes to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(folder: Path) -> None:
    """Push ``folder``'s entries (a rename into it) to the disk; a file system that cannot
    sync a folder (some network mounts) is left as it is."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def temp_beside(target: Path) -> Path:
    """A new, empty, unique temporary file in ``target``'s folder (``.NAME.*.tmp``)."""
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=_TEMP_SUFFIX)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would become the published file's mode
    finally:
        os.close(fd)
    return Path(name)


def publish(temp: Path, target: Path) -> None:
    """Sync ``temp`` (written in full), rename it to ``target``, sync the folder."""
    fsync_file(temp)
    os.replace(temp, target)
    fsync_dir(target.parent)


def replace_file_atomically(
    target: Path, *, source: Path | None = None, data: bytes | None = None
) -> None:
    """Write ``target`` whole: a copy of ``source`` or ``data``. On failure nothing is
    left under a new name and the old ``target`` (if any) stays."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = temp_beside(target)
    try:
        if source is not None:
            shutil.copyfile(source, temp)
        else:
            temp.write_bytes(data or b"")
        publish(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise


def remove_stale(target: Path) -> list[Path]:
    """Remove the temporary files of ``target`` that writers killed midway left
    (only where no other writer can be at work: the caller holds the folder's lock)."""
    removed = []
    # with what SQLite keeps beside a file (-journal, -wal) when killed inside a write
    for path in target.parent.glob(f".{glob_escape(target.name)}.*{_TEMP_SUFFIX}*"):
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
    return removed


def glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


@contextlib.contextmanager
def written_beside(target: Path) -> Iterator[Path]:
    """A temporary path beside ``target`` to write; published to ``target`` when the
    block ends without an error, removed when it raises."""
    temp = temp_beside(target)
    try:
        yield temp
        publish(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
