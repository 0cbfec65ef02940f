"""The on-disk layout of an eval run: streamed JSONL, metadata, then a dataset.

``results.jsonl`` gets one line per rollout as each group completes (flushed to
the OS, so a killed process loses only groups in flight); ``metadata.json``
describes the run and is rewritten atomically; ``dataset/`` is written at the
end from the JSONL, so memory never holds the whole run.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from vfops._errors import VfopsError
from vfops._rollout import RolloutRecord, rollout_features
from vfops.envs._dataset import quiet_datasets

RESULTS_FILE = "results.jsonl"
METADATA_FILE = "metadata.json"
DATASET_DIR = "dataset"


class RolloutWriter:
    """Appends rollout records to ``results.jsonl``, one flushed write per group."""

    def __init__(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / RESULTS_FILE
        repair_tail(self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write_group(self, records: list[RolloutRecord]) -> None:
        # One os.write per group: no user-space buffer to lose on kill -9.
        os.write(self._fd, b"".join(r.to_json() + b"\n" for r in records))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RolloutWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    """Atomically replace ``metadata.json``."""
    data = orjson.dumps(metadata, default=str, option=orjson.OPT_INDENT_2)
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".metadata.", suffix=".tmp")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, run_dir / METADATA_FILE)


def read_metadata(run_dir: Path) -> dict[str, Any]:
    path = run_dir / METADATA_FILE
    if not path.exists():
        raise VfopsError(f"{run_dir} is not an eval run directory (no {METADATA_FILE})")
    data: dict[str, Any] = orjson.loads(path.read_bytes())
    return data


def write_dataset(run_dir: Path, metadata: dict[str, Any]) -> Path:
    """Convert ``results.jsonl`` into a ``datasets`` dataset saved under ``dataset/``."""
    from datasets import Dataset

    def rows() -> Iterator[dict[str, Any]]:
        for record in iter_records(run_dir):
            yield record.to_row()

    with tempfile.TemporaryDirectory(dir=run_dir, prefix=".cache.") as cache, quiet_datasets():
        dataset = Dataset.from_generator(rows, features=rollout_features(), cache_dir=cache)
        dataset.info.description = orjson.dumps(metadata, default=str).decode()
        target = run_dir / DATASET_DIR
        dataset.save_to_disk(str(target))
    return target


def load_results(run_dir: Path) -> Any:
    """Load a finished run's ``dataset/`` (rows convert back with RolloutRecord.from_row)."""
    from datasets import load_from_disk

    return load_from_disk(str(run_dir / DATASET_DIR))
