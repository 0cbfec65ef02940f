"""The tracker's memory does not grow with the run: whatever backlog of
``results.jsonl`` it has to catch up on (a busy machine, a 100,000-rollout run), it
holds one slice's rows, one export batch and the trace sample, never the backlog.

A regression guard on the structures themselves (the allocations Python traces while
the tracker reads a backlog, and the sizes of what it keeps), not on a process's RSS:
bench/eval_overhead.py --only memory measures the whole tree against its bar. The
tracker's module is a program (importing it takes over stdout and keeps pandas out of
the process): it runs in an interpreter of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import vfops

SOURCE_ROOT = str(Path(vfops.__file__).resolve().parents[1])
LIMIT = 20
"""Traces per run (passing and failed each)."""

_MEASURE = """
import json, sys, tracemalloc
from pathlib import Path
import orjson
from tests.registry_fixtures import make_record
from vfops._arrow import ResultsExport
from vfops.tracking import _tracker_main
from vfops.tracking._traces import TraceSampler

root, limit = Path(sys.argv[1]), int(sys.argv[2])


def catch_up(name, rows):
    # the tracker's run log with its reading side only (export and trace sample; its
    # MLflow writer left out), reading a backlog of `rows` rollouts in one go, as a
    # tracker that fell behind does at its seal
    folder = root / name
    folder.mkdir()
    results = folder / "results.jsonl"
    with results.open("wb") as handle:
        for i in range(rows):  # failed (reward 0.25) and passing, of index 0 and not
            handle.write(orjson.dumps(make_record(i // 2, i % 2).to_dict()) + b"\\n")
    log = _tracker_main._RunLog.__new__(_tracker_main._RunLog)
    log._results, log._lifeline, log._offset = results, None, 0
    log._export, log._export_error = ResultsExport(folder / "rollouts.arrow"), None
    log._held, log._writer = [], None
    log._sampler = TraceSampler(limit=limit, failed_limit=limit)
    size = results.stat().st_size
    tracemalloc.start()
    log._read_to(size, trace=False)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {
        "peak": peak, "read": log._offset == size, "batch": len(log._export.take()),
        "held": len(log._held), "reserve": len(log._sampler.rest()),
    }


catch_up("warm", 1_100)  # a first Arrow batch: its set-up is not the reading
print(json.dumps({"small": catch_up("small", 2_000), "large": catch_up("large", 8_000)}))
"""


def test_catching_up_holds_a_slice_not_the_backlog(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": SOURCE_ROOT}
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(tmp_path), str(LIMIT)],
        capture_output=True, text=True, env=env, cwd=SOURCE_ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # the tracker's module sends its own stdout to stderr: its protocol has the original
    found = json.loads(done.stderr.strip().splitlines()[-1])
    small, large = found["small"], found["large"]
    assert small["read"] and large["read"]
    # four times the backlog (~4 MB of JSON lines), about the same peak: one slice of
    # parsed rows and one Arrow batch at a time (6.5 MB at both sizes here; read whole,
    # 18 and 74 MB)
    assert large["peak"] < small["peak"] * 1.5, (small, large)
    # and what stays between reads is bounded by the settings, not by the run
    assert large["batch"] < 1024  # the export's batch: the rest is on disk
    assert large["held"] <= 2 * LIMIT  # the trace sample, held for the finish
    assert large["reserve"] <= LIMIT


_OPEN_STORE = """
import json, sys
from vfops.tracking import _tracker_main  # its settings, as the tracker process has them
from vfops.tracking import check_tracking, prepare_experiment

check_tracking()
prepare_experiment("arithmetic")
import mlflow.store.tracking.sqlalchemy_store  # the store the tracker records through
print(json.dumps(sorted(name for name in ("numpy", "pandas", "pygments") if sys.modules.get(name))))
"""


def test_the_tracker_records_without_numpy_or_pandas(tmp_path: Path) -> None:
    # ~13 and ~50 MB of a process that has no use for them (the rollouts arrive as
    # JSON); the tracked-eval tests show the runs it records are whole without them
    env = {**os.environ, "PYTHONPATH": SOURCE_ROOT, "VFOPS_HOME": str(tmp_path)}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run(
        [sys.executable, "-c", _OPEN_STORE],
        capture_output=True, text=True, env=env, cwd=SOURCE_ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []
