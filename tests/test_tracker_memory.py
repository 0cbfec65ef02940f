"""The tracker's memory does not grow with the run: whatever backlog of
``results.jsonl`` it has to catch up on (a busy machine, a 100,000-rollout run), it
holds one slice's rows, one export batch and the trace sample, never the backlog.

A regression guard on the structures themselves (the allocations Python traces while
the tracker reads a backlog, and the sizes of what it keeps), not on a process's RSS:
bench/eval_overhead.py --only memory measures the whole tree against its bar."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import orjson

from tests.registry_fixtures import make_record
from vfops._arrow import ResultsExport
from vfops.tracking import _tracker_main
from vfops.tracking._traces import TraceSampler

LIMIT = 20
"""Traces per run (passing and failed each)."""


def _results(path: Path, rows: int) -> int:
    with path.open("wb") as handle:
        for i in range(rows):
            # failed (reward 0.25) and passing rollouts, of index 0 and not
            handle.write(orjson.dumps(make_record(i // 2, i % 2).to_dict()) + b"\n")
    return path.stat().st_size


def _reader(folder: Path) -> _tracker_main._RunLog:
    """The tracker's run log with its reading side only (export and trace sample; its
    MLflow writer is left out: the traces it is handed are counted instead)."""
    log = _tracker_main._RunLog.__new__(_tracker_main._RunLog)
    log._results = folder / "results.jsonl"
    log._lifeline = None
    log._offset = 0
    log._export = ResultsExport(folder / "rollouts.arrow")
    log._export_error = None
    log._held = []
    log._sampler = TraceSampler(limit=LIMIT, failed_limit=LIMIT)
    log._writer = None
    return log


def _catch_up(folder: Path, rows: int) -> tuple[int, _tracker_main._RunLog]:
    """Traced peak (bytes) of reading a backlog of ``rows`` rollouts in one go, as a
    tracker that fell behind does at its seal."""
    folder.mkdir()
    size = _results(folder / "results.jsonl", rows)
    log = _reader(folder)
    tracemalloc.start()
    try:
        log._read_to(size, trace=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert log._offset == size
    return peak, log


def test_catching_up_holds_a_slice_not_the_backlog(tmp_path: Path) -> None:
    _catch_up(tmp_path / "warm", 1_100)  # a first Arrow batch: its set-up is not the reading
    small, _ = _catch_up(tmp_path / "small", 2_000)
    large, log = _catch_up(tmp_path / "large", 8_000)
    # four times the backlog (~4 MB of JSON lines), about the same peak: one slice of
    # parsed rows and one Arrow batch at a time (6.5 MB at both sizes here; read whole,
    # 18 and 74 MB)
    assert large < small * 1.5, (small, large)
    # and what stays between reads is bounded by the settings, not by the run
    assert log._export is not None
    assert len(log._export.take()) < 1024  # the export's batch: the rest is on disk
    assert len(log._held) <= 2 * LIMIT  # the trace sample, held for the finish
    assert log._sampler is not None and len(log._sampler.rest()) <= LIMIT
