"""A run folder that fills up, and a run resumed from where its files are now (issue 25: 1, 2).

The output folder is a small tmpfs mounted for the test (root can: the suite runs as
root on these machines), so the disk fills in the middle of a real ``vfops eval``:
short writes happen for real. Whatever the point the disk filled at, the run fails in
one line naming the folder and how to finish it, the registry never holds a rollout
the folder lacks, nothing half-written is left (no ``.metadata.*.tmp``, no torn line),
and ``--resume`` (in place once there is room, or from a copy moved elsewhere) ends
with exactly N x R rollouts on disk, in the Arrow export, in the registry and in MLflow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.test_bad_input import vfops
from vfops.testing import StubConfig, StubServer

N, R = 1000, 2
ARGS = ("eval", "arithmetic", "-m", "stub-model", "-n", str(N), "-r", str(R), "-q",
        "-a", f'{{"num_examples": {N}}}')  # fmt: skip
FULL_ENV = {"VFOPS_TRACKING": "1"}  # MLflow on: its counts are checked too


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs: room for the run's first few hundred rollouts only."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(reply_mode="arithmetic")) as server:
        yield server


def _run_dir(root: Path) -> Path:
    (metadata,) = root.rglob("metadata.json")
    return metadata.parent


def _keys_on_disk(run_dir: Path) -> list[tuple[int, int]]:
    data = (run_dir / "results.jsonl").read_bytes()
    assert not data or data.endswith(b"\n"), "a torn last line"
    rows = [orjson.loads(line) for line in data.splitlines()]
    return [(row["example_id"], row["rollout_index"]) for row in rows]


def _registry_count(home: Path) -> tuple[str, int]:
    import sqlite3

    database = sqlite3.connect(home / "registry.db")
    try:
        (run_id,) = database.execute("SELECT id FROM eval_runs").fetchone()
        (count,) = database.execute("SELECT count(*) FROM rollouts").fetchone()
    finally:
        database.close()
    return str(run_id), int(count)


def _fill_up(tmp: Path, disk: Path, stub: StubServer) -> tuple[str, Path]:
    """Run until the small disk is full; check the failure; return the run and folder."""
    (tmp / "home").mkdir()
    done = vfops([*ARGS, "-b", stub.base_url, "-o", str(disk)], tmp, FULL_ENV)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: "), line
    assert "No space left on device" in line and "--resume" in line, line
    run_dir = _run_dir(disk)
    on_disk = _keys_on_disk(run_dir)
    run_id, in_registry = _registry_count(tmp / "home")
    assert 0 < len(on_disk) < N * R
    assert len(on_disk) == len(set(on_disk))
    # a group reaches the registry only once it is wholly on disk
    assert in_registry <= len(on_disk)
    assert not list(run_dir.glob(".metadata.*.tmp")), list(run_dir.iterdir())
    metadata = orjson.loads((run_dir / "metadata.json").read_bytes())
    assert metadata["status"] in ("running", "failed")  # the end may not fit either
    return run_id, run_dir


def _assert_complete(tmp: Path, run_dir: Path, run_id: str) -> None:
    from datasets import Dataset

    from vfops.tracking import mlflow_client

    keys = _keys_on_disk(run_dir)
    assert len(keys) == len(set(keys)) == N * R
    assert Dataset.from_file(str(run_dir / "rollouts.arrow")).num_rows == N * R
    assert _registry_count(tmp / "home") == (run_id, N * R)
    metadata = orjson.loads((run_dir / "metadata.json").read_bytes())
    assert metadata["status"] == "completed" and metadata["summary"]["rollouts"] == N * R
    os.environ["VFOPS_HOME"] = str(tmp / "home")
    try:
        logged = mlflow_client().get_run(metadata["mlflow_run_id"])
    finally:
        del os.environ["VFOPS_HOME"]
    assert logged.info.status == "FINISHED" and logged.data.metrics["rollouts"] == N * R


def test_a_full_disk_fails_the_run_in_one_line_and_resume_completes_it_in_place(
    tmp_path: Path, small_disk: Path, stub: StubServer
) -> None:
    run_id, run_dir = _fill_up(tmp_path, small_disk, stub)
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    done = vfops([*ARGS, "-b", stub.base_url, "--resume", run_id], tmp_path, FULL_ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    _assert_complete(tmp_path, run_dir, run_id)


def test_a_run_moved_off_a_full_disk_resumes_where_its_files_are_now(
    tmp_path: Path, small_disk: Path, stub: StubServer
) -> None:
    """--resume NEW_FOLDER: the run continues in the folder given (the registry's
    record of where it lives follows), not in the full one it was started in."""
    run_id, run_dir = _fill_up(tmp_path, small_disk, stub)
    moved = tmp_path / "elsewhere" / run_dir.name
    shutil.copytree(run_dir, moved)
    (moved / ".lock").unlink(missing_ok=True)
    done = vfops([*ARGS, "-b", stub.base_url, "--resume", str(moved)], tmp_path, FULL_ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    _assert_complete(tmp_path, moved, run_id)
    assert f"results: {moved}" in done.stdout
    # and a later resume by id finds it there
    again = vfops([*ARGS, "-b", stub.base_url, "--resume", run_id], tmp_path, FULL_ENV)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"results: {moved}" in again.stdout
