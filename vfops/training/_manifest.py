"""Atomic, verified checkpoint folders: written beside their place, sealed, renamed in.

A checkpoint is never written where it will be read. :func:`begin` makes an empty
*staging* folder beside the target (``.NAME.partial``); the writers fill it; :func:`seal`
fsyncs every file, records each one's size and sha256 in ``manifest.json`` (written
last, itself fsynced) and fsyncs the folders; :func:`publish` renames it into place:
an old checkpoint there is first renamed aside (``.NAME.old``), the new one renamed
in, the old one removed. A ``kill -9`` at any point leaves, on disk, the old whole
checkpoint or the new whole one: :func:`recover` (run by the next save and the next
resume) finishes or rolls back a publish it interrupted.

:func:`verify` is what a resume trusts: a folder without a manifest (a save that did not
finish, or one written before checkpoints had manifests) or whose files differ from it
is refused in one line naming an earlier checkpoint to resume from, before any model
loads.

Light module (stdlib only): ``vfops train`` verifies a resume folder at the door.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

from vfops._errors import VfopsError

__all__ = [
    "KILL_POINT_ENV",
    "MANIFEST_FILE",
    "CheckpointError",
    "aside_path",
    "begin",
    "kill_point",
    "open_checkpoint",
    "publish",
    "recover",
    "seal",
    "staging_path",
    "verify",
]

MANIFEST_FILE = "manifest.json"
_FORMAT = 1
_CHUNK = 1 << 20
STATE_FILE = "trainer_state.json"  # the step a checkpoint holds (also _checkpoint's)

KILL_POINT_ENV = "VFOPS_TEST_CHECKPOINT_KILL_AT"
"""Fault injection for the crash tests: the process kills itself with SIGKILL (what
``kill -9`` does) when a save reaches the named point: ``staging`` (accelerate's state
written, the rest not), ``sealed`` (manifest written, nothing moved), ``aside`` (the old
checkpoint moved aside, the new one not yet in place) or ``published`` (the new one in
place, the old one not yet removed). Unset in normal use."""


class CheckpointError(VfopsError):
    """A checkpoint folder that cannot be resumed from: torn, damaged, or not one."""


def staging_path(target: Path) -> Path:
    """Where a checkpoint for ``target`` is written before it is renamed into place."""
    return target.parent / f".{target.name}.partial"


def aside_path(target: Path) -> Path:
    """Where the checkpoint ``target`` replaces waits while the new one is renamed in."""
    return target.parent / f".{target.name}.old"


def kill_point(name: str) -> None:
    """The crash tests' hook (:data:`KILL_POINT_ENV`): SIGKILL this process at ``name``."""
    if os.environ.get(KILL_POINT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------- writing


def begin(target: Path) -> Path:
    """An empty staging folder for a new checkpoint at ``target`` (a leftover of an
    interrupted save is removed, an interrupted publish finished first)."""
    recover(target)
    staging = staging_path(target)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    return staging


def seal(staging: Path) -> None:
    """Make ``staging`` durable and self-describing: every file fsynced and listed with
    its size and sha256 in the manifest, written last (temp file, fsync, rename)."""
    files: dict[str, dict[str, Any]] = {}
    for path in _files(staging):
        files[path.relative_to(staging).as_posix()] = {
            "size": path.stat().st_size,
            "sha256": _sha256(path, fsync=True),
        }
    manifest = json.dumps({"format": _FORMAT, "files": files}, indent=1, sort_keys=True)
    partial = staging / f"{MANIFEST_FILE}.partial"
    with partial.open("w") as out:
        out.write(manifest + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, staging / MANIFEST_FILE)
    for folder in sorted(_folders(staging), key=lambda p: len(p.parts), reverse=True):
        _fsync_dir(folder)
    kill_point("sealed")


def publish(staging: Path, target: Path) -> None:
    """Rename the sealed ``staging`` folder to ``target``, replacing what is there:
    the old one renamed aside first and removed last, each step made durable."""
    aside = aside_path(target)
    if target.exists():
        if aside.exists():
            shutil.rmtree(aside)
        os.rename(target, aside)
        _fsync_dir(target.parent)
        kill_point("aside")
    os.rename(staging, target)
    _fsync_dir(target.parent)
    kill_point("published")
    if aside.exists():
        shutil.rmtree(aside)
        _fsync_dir(target.parent)


def recover(target: Path) -> None:
    """Finish or undo a :func:`publish` that a crash interrupted: with ``target`` gone,
    a sealed, intact staging folder is renamed in (the crash came after the old one was
    moved aside), else the old one is moved back; a leftover old one is removed."""
    staging, aside = staging_path(target), aside_path(target)
    if not target.exists():
        if staging.is_dir() and _intact(staging):
            _rename_if_absent(staging, target)
        elif aside.is_dir():
            _rename_if_absent(aside, target)
    if target.is_dir() and aside.exists():
        shutil.rmtree(aside, ignore_errors=True)


def _rename_if_absent(src: Path, target: Path) -> None:
    # another process may be finishing the same publish: whoever renames first wins
    with contextlib.suppress(FileNotFoundError, FileExistsError, OSError):
        if not target.exists():
            os.rename(src, target)
            _fsync_dir(target.parent)


# --------------------------------------------------------------------------- reading

# verified folders: path -> (stat of every file) at the time; a folder verified again in
# the same process with nothing changed is not hashed again (the door and the recipe
# both verify a resume folder)
_VERIFIED: dict[Path, tuple[tuple[str, int, int, int], ...]] = {}


def open_checkpoint(folder: Path) -> Path:
    """``folder`` made whole again if a publish to it was interrupted (:func:`recover`),
    then verified (:func:`verify`); its resolved path."""
    recover(folder)
    if not folder.is_dir():
        raise CheckpointError(f"resume {str(folder)!r} is not a folder; pass a checkpoint folder")
    verify(folder)
    return folder.resolve()


def verify(folder: Path) -> None:
    """Raise :class:`CheckpointError` (one line, naming an earlier checkpoint) unless
    ``folder`` is a whole checkpoint: its manifest present and every file in it there,
    with the recorded size and sha256."""
    folder = folder.resolve()
    stats = _stats(folder)
    if _VERIFIED.get(folder) == stats:
        return
    problem = _problem(folder)
    if problem:
        raise CheckpointError(f"checkpoint {folder} {problem}; {_fix(folder)}")
    _VERIFIED[folder] = stats


def _problem(folder: Path) -> str:
    """What makes ``folder`` not a whole checkpoint ('' if nothing)."""
    manifest = folder / MANIFEST_FILE
    if not manifest.is_file():
        if not (folder / STATE_FILE).is_file():
            return f"is not a vfops training checkpoint (no {MANIFEST_FILE} or {STATE_FILE})"
        return (
            f"is incomplete (no {MANIFEST_FILE}: its save was interrupted, or a vfops "
            "without checkpoint manifests wrote it)"
        )
    try:
        files = json.loads(manifest.read_text())["files"]
        listed = {str(name): (int(e["size"]), str(e["sha256"])) for name, e in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"is damaged ({MANIFEST_FILE} is unreadable)"
    if STATE_FILE not in listed:
        return f"is not a vfops training checkpoint ({MANIFEST_FILE} lists no {STATE_FILE})"
    for name, (size, digest) in sorted(listed.items()):
        path = folder / name
        if not path.is_file():
            return f"is damaged ({name}, listed in {MANIFEST_FILE}, is missing)"
        if path.stat().st_size != size or _sha256(path) != digest:
            return f"is damaged ({name} differs from its sha256 in {MANIFEST_FILE})"
    return ""


def _intact(folder: Path) -> bool:
    return (folder / MANIFEST_FILE).is_file() and not _problem(folder)


def _fix(folder: Path) -> str:
    """Resume from the newest other complete-looking checkpoint beside ``folder`` (by its
    step), or train again."""
    candidates: list[tuple[int, Path]] = []
    parent = folder.parent
    with contextlib.suppress(OSError):
        for sibling in parent.iterdir():
            if sibling == folder or sibling.name.startswith("."):
                continue
            if (sibling / MANIFEST_FILE).is_file():
                candidates.append((_step(sibling), sibling))
    if candidates:
        return f"resume from the previous checkpoint instead: --resume {max(candidates)[1]}"
    return (
        f"no other checkpoint in {parent} to resume from: train again without --resume "
        "([run] save_every keeps a checkpoint every N steps)"
    )


def _step(folder: Path) -> int:
    try:
        return int(json.loads((folder / STATE_FILE).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1


# --------------------------------------------------------------------------- files


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _folders(root: Path) -> list[Path]:
    return [root, *(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())]


def _stats(folder: Path) -> tuple[tuple[str, int, int, int], ...]:
    try:
        return tuple(
            (p.relative_to(folder).as_posix(), s.st_size, s.st_mtime_ns, s.st_ino)
            for p in _files(folder)
            for s in (p.stat(),)
        )
    except OSError:
        return ()


def _sha256(path: Path, *, fsync: bool = False) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
        if fsync:
            os.fsync(file.fileno())
    return digest.hexdigest()


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
