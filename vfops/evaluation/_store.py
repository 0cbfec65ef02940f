"""The on-disk layout of an eval run: streamed JSONL, metadata, an Arrow export.

``results.jsonl`` gets one line per rollout as each group completes (flushed to
the OS, so a killed process loses only groups in flight); ``metadata.json``
describes the run and is rewritten atomically; ``rollouts.arrow`` (an Arrow IPC
stream that ``datasets`` memory-maps) is written in batches during the run by
the export sink (:mod:`vfops.evaluation._sinks`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from vfops._errors import VfopsError
from vfops._rollout import RolloutRecord, dumps_escaped
from vfops.envs import quiet_datasets

RESULTS_FILE = "results.jsonl"
METADATA_FILE = "metadata.json"
ARROW_FILE = "rollouts.arrow"
LEGACY_DATASET_DIR = "dataset"


class RolloutWriter:
    """Appends rollout records to ``results.jsonl``, one flushed write per group.

    A group is on disk whole or not at all: a write the disk takes only part of (a
    full disk) is cut back to where the group began and raises :class:`DiskWriteError`,
    so that nothing after it claims a group the folder lacks. :attr:`size` is the
    file's length, always at the end of a group.
    """

    def __init__(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / RESULTS_FILE
        repair_tail(self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.size = os.fstat(self._fd).st_size

    def write_group(self, records: list[RolloutRecord]) -> None:
        # One os.write per group: no user-space buffer to lose on kill -9.
        data = b"".join(r.to_json() + b"\n" for r in records)
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):
                # os.write may take part of the buffer without raising (a disk filling up)
                written += os.write(self._fd, view[written:])
        except OSError as exc:
            self._cut_back()
            raise DiskWriteError(self.path, exc) from exc
        self.size += written

    def _cut_back(self) -> None:
        """Drop what a failed group write left (its lines must not be half there)."""
        # if even this fails, repair_tail drops a partial last line when the run resumes
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, self.size)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RolloutWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DiskWriteError(VfopsError):
    """The run folder could not take a write (a full disk, a read-only mount)."""

    def __init__(self, path: Path, exc: OSError) -> None:
        reason = exc.strerror or type(exc).__name__
        super().__init__(f"could not write {path} ({reason})")
        self.path = path


def repair_tail(path: Path) -> None:
    """Drop a partial last line left by a crash mid-write."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
        size = handle.seek(0, os.SEEK_END)
        chunk = min(size, 1 << 20)
        handle.seek(size - chunk)
        tail = handle.read(chunk)
        cut = tail.rfind(b"\n")
        handle.truncate(size - chunk + cut + 1 if cut >= 0 else 0)


def iter_records(run_dir: Path) -> Iterator[RolloutRecord]:
    """Stream the records of a run directory."""
    path = run_dir / RESULTS_FILE
    if not path.exists():
        return
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            if not line.endswith(b"\n"):
                return  # partial last line of a crashed run; repaired on resume
            try:
                yield RolloutRecord.from_json(line)
            except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
                raise VfopsError(
                    f"{path}:{number} is not a valid rollout record ({exc}); "
                    "remove that line or start a new run without --resume"
                ) from exc


def write_metadata(run_dir: Path, metadata: dict[str, Any]) -> None:
    """Atomically replace ``metadata.json``; on failure nothing is left behind (the
    previous file stays) and :class:`DiskWriteError` says why."""
    data = dumps_escaped(metadata, orjson.OPT_INDENT_2)  # a lone surrogate: escaped
    target = run_dir / METADATA_FILE
    try:
        fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".metadata.", suffix=".tmp")
    except OSError as exc:
        raise DiskWriteError(target, exc) from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)  # a buffered file: a short write raises here or on close
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise DiskWriteError(target, exc) from exc


def read_metadata(run_dir: Path) -> dict[str, Any]:
    path = run_dir / METADATA_FILE
    if not path.exists():
        raise VfopsError(f"{run_dir} is not an eval run directory (no {METADATA_FILE})")
    data: dict[str, Any] = orjson.loads(path.read_bytes())
    return data


def load_results(run_dir: Path) -> Any:
    """A run's rollouts as a ``datasets.Dataset`` (rows convert back with
    ``RolloutRecord.from_row``), memory-mapped from its ``rollouts.arrow``, which is
    checked first (:func:`checked_export`): a damaged or stale one is rebuilt from
    ``results.jsonl``."""
    from datasets import Dataset, load_from_disk

    arrow = run_dir / ARROW_FILE
    if arrow.exists() or (run_dir / RESULTS_FILE).exists():
        with quiet_datasets():
            return Dataset.from_file(str(checked_export(run_dir)))
    if (run_dir / LEGACY_DATASET_DIR).is_dir():  # runs written before rollouts.arrow
        return load_from_disk(str(run_dir / LEGACY_DATASET_DIR))
    raise VfopsError(
        f"{run_dir} has no rollouts.arrow (the run never finished a session); "
        "finish it with vfops eval ... --resume"
    )


def checked_export(run_dir: Path) -> Path:
    """``rollouts.arrow`` of ``run_dir``, readable and holding every rollout of its
    ``results.jsonl`` (the source of truth): one that is damaged (torn, overwritten),
    stale (a session killed before it sealed its export) or missing is rebuilt from
    ``results.jsonl`` first, atomically, while no process works on the run; one that
    cannot be rebuilt is refused in one line naming the fix."""
    from vfops._arrow import DamagedExport, stream_rows

    arrow, results = run_dir / ARROW_FILE, run_dir / RESULTS_FILE
    problem: str | None = None
    if not arrow.exists():
        problem = f"{arrow} is missing"
    else:
        try:
            rows = stream_rows(arrow)
        except DamagedExport as exc:
            problem = str(exc)
        else:
            if not results.exists() or rows == (lines := count_records(results)):
                return arrow
            problem = f"{arrow} holds {rows} rollouts, {results.name} {lines}"
    if not results.exists():
        raise VfopsError(
            f"{problem}, and {run_dir} has no {RESULTS_FILE} to rebuild it from; export the "
            "run from the registry instead: vfops runs export RUN_ID --to FOLDER"
        )
    rebuild_export(run_dir, problem)
    return arrow


def count_records(path: Path) -> int:
    """Complete lines of a ``results.jsonl`` (a partial last line is not a record)."""
    count = 0
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            count += chunk.count(b"\n")
    return count


def rebuild_export(run_dir: Path, problem: str) -> None:
    """Write ``rollouts.arrow`` again from ``results.jsonl``, under the run folder's lock
    (a run being worked on is refused: its own writer seals the file)."""
    from vfops._arrow import ResultsExport
    from vfops._folder_lock import RunFolderBusyError, RunFolderLock
    from vfops.tracking import wait_for_tracker

    lock = RunFolderLock(run_dir)
    try:
        lock.acquire()
    except RunFolderBusyError as exc:
        raise VfopsError(
            f"{problem}; it is rebuilt from {RESULTS_FILE} once the run is not worked on ({exc})"
        ) from None
    try:
        wait_for_tracker(run_dir)
        export = ResultsExport(run_dir / ARROW_FILE)
        batch: list[RolloutRecord] = []
        for record in iter_records(run_dir):
            batch.append(record)
            if len(batch) >= 1024:
                export.add(batch)
                batch = []
        export.add(batch)
        export.seal()
    except OSError as exc:
        raise VfopsError(
            f"{problem}, and it could not be rebuilt from {RESULTS_FILE} "
            f"({exc.strerror or exc}); make room in {run_dir} (or fix what refused the "
            "write) and load it again"
        ) from None
    finally:
        lock.release()
