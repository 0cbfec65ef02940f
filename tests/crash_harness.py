"""kill -9 of a tracked ``vfops eval`` at a point of its run, then ``--resume`` at once,
and every store counted: shared by tests/test_crash_resume.py (a short matrix in CI)
and bench/crash_matrix.py (the long one).

Real processes throughout: the CLI in a session of its own (so its whole tree can be
killed), the stub endpoint on loopback, the embedded MLflow store under a fresh
``VFOPS_HOME``, the registry at ``db_url``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

Mode = Literal["main", "tree", "tracker"]
TRACKER_MODULE = "vfops.tracking._tracker_main"


@dataclass
class Outcome:
    """What one kill-and-resume left, store by store."""

    mode: str
    at: str
    killed_at_rows: int = 0
    first_exit: int | None = None
    resume_exit: int | None = None
    resume_s: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    status: str = ""
    mlflow_status: str = ""
    problems: list[str] = field(default_factory=list)
    stderr: str = ""

    @property
    def exact(self) -> bool:
        return not self.problems


def eval_args(base_url: str, out: Path, examples: int, rollouts: int) -> list[str]:
    return [
        "eval", "echo_env", "-a", orjson.dumps({"num_examples": examples}).decode(),
        "-m", "stub-model", "-b", base_url, "-n", str(examples), "-r", str(rollouts),
        "-c", "64", "-o", str(out),
    ]  # fmt: skip


def cli_env(home: Path, db_url: str, site: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "VFOPS_HOME": str(home),
        "VFOPS_DATABASE_URL": db_url,
        # the caller's own path after the environments (a checkout under test)
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        "COLUMNS": "200",
    }
    for name in ("MLFLOW_TRACKING_URI", "VFOPS_TRACKING"):  # the embedded store, tracked
        env.pop(name, None)
    return env


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "vfops", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,  # its own group: "tree" kills exactly it
        )


def lines_of(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def wait_for(probe: Callable[[], Any], what: str, timeout_s: float = 300.0) -> Any:
    """``probe()`` once truthy (polled; the deadline is only a safety net)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of ``pid``'s child processes (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append((int(entry.name), command))
        except (OSError, ValueError, IndexError):
            continue
    return found


def tracker_of(pid: int) -> int | None:
    for child, command in children(pid):
        if TRACKER_MODULE in command:
            return child
    return None


def run_dir_of(out: Path) -> Path | None:
    found = list(out.glob("evals/*/*/metadata.json")) + list(out.glob("evals/*/*/results.jsonl"))
    return found[0].parent if found else None


def kill(process: subprocess.Popen[bytes], mode: Mode) -> None:
    if mode == "tree":
        os.killpg(process.pid, signal.SIGKILL)
    elif mode == "main":
        process.send_signal(signal.SIGKILL)
    else:
        tracker = tracker_of(process.pid)
        assert tracker is not None, "no tracker to kill"
        os.kill(tracker, signal.SIGKILL)


def crash_and_resume(
    work: Path,
    *,
    db_url: str,
    site: Path,
    base_url: str,
    mode: Mode,
    at_fraction: float,
    examples: int,
    rollouts: int,
) -> Outcome:
    """Run, kill (``mode``) once ``at_fraction`` of the rollouts are on disk (1.0: all of
    them, the run then finishing), resume at once, and count every store."""
    home, out = work / "home", work / "out"
    home.mkdir(parents=True, exist_ok=True)
    env = cli_env(home, db_url, site)
    args = eval_args(base_url, out, examples, rollouts)
    total = examples * rollouts
    outcome = Outcome(mode=mode, at=f"{at_fraction:.0%}")
    target = max(1, int(total * at_fraction))
    process = start(args, env, work / "first.log")
    try:
        # the tracker is up (the kill may need it) and the rows are on disk
        wait_for(lambda: tracker_of(process.pid) or process.poll() is not None, "the tracker")
        run_dir = wait_for(lambda: run_dir_of(out), "the run folder")
        wait_for(
            lambda: lines_of(run_dir / "results.jsonl") >= target or process.poll() is not None,
            f"{target} rollouts on disk",
        )
        outcome.killed_at_rows = lines_of(run_dir / "results.jsonl")
        if process.poll() is None:
            kill(process, mode)
        outcome.first_exit = process.wait(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    started = time.monotonic()
    resumed = subprocess.run(
        [sys.executable, "-m", "vfops", *args, "--resume", str(run_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    outcome.resume_s = time.monotonic() - started
    outcome.resume_exit = resumed.returncode
    outcome.stderr = resumed.stderr[-2000:]
    if resumed.returncode != 0:
        outcome.problems.append(f"resume exited {resumed.returncode}")
    count_stores(outcome, run_dir, db_url, home, total)
    return outcome


def count_stores(outcome: Outcome, run_dir: Path, db_url: str, home: Path, total: int) -> None:
    """Every store holds each of the ``total`` rollouts once, and says completed."""
    keys = [
        (row["example_id"], row["rollout_index"])
        for row in map(orjson.loads, (run_dir / "results.jsonl").read_bytes().splitlines())
    ]
    _expect(outcome, "results.jsonl", len(keys), len(set(keys)), total)
    _count_arrow(outcome, run_dir / "rollouts.arrow", total)
    run_id = str(orjson.loads((run_dir / "metadata.json").read_bytes())["run_id"])
    _count_registry(outcome, db_url, run_id, total)
    _count_mlflow(outcome, home, run_id, total)


def _expect(outcome: Outcome, store: str, rows: int, unique: int, total: int) -> None:
    outcome.counts[store] = rows
    if not rows == unique == total:
        outcome.problems.append(f"{store}: {rows} rows, {unique} distinct, not {total}")


def _count_arrow(outcome: Outcome, path: Path, total: int) -> None:
    """Read as it is (not through load_results, which would rebuild a damaged one)."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(path), "r") as source:
            table = pa.ipc.open_stream(source).read_all()
    except (OSError, pa.ArrowException) as exc:
        outcome.counts["rollouts.arrow"] = -1
        outcome.problems.append(f"rollouts.arrow unreadable: {exc}")
        return
    keys = set(
        zip(table["example_id"].to_pylist(), table["rollout_index"].to_pylist(), strict=True)
    )
    _expect(outcome, "rollouts.arrow", table.num_rows, len(keys), total)


def _count_registry(outcome: Outcome, db_url: str, run_id: str, total: int) -> None:
    from sqlalchemy import text

    from vfops.registry import get_engine

    with get_engine(db_url).connect() as connection:
        rows = connection.execute(
            text("SELECT count(*), count(DISTINCT example_id * 100000 + rollout_index) "
                 "FROM rollouts WHERE run_id = :id"), {"id": run_id},
        ).one()  # fmt: skip
        outcome.status = str(
            connection.execute(
                text("SELECT status FROM eval_runs WHERE id = :id"), {"id": run_id}
            ).scalar_one()
        )
    _expect(outcome, "registry", int(rows[0]), int(rows[1]), total)
    if outcome.status != "completed":
        outcome.problems.append(f"registry status {outcome.status}")


def _count_mlflow(outcome: Outcome, home: Path, run_id: str, total: int) -> None:
    """The MLflow run: FINISHED, its rollouts metric and its parquet artifact whole."""
    import pyarrow.parquet as pq

    from vfops.tracking import mlflow_client

    client = mlflow_client(f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("vfops/echo_env")
    found = (
        client.search_runs(
            [experiment.experiment_id], filter_string=f"tags.`vfops.run_id` = '{run_id}'"
        )
        if experiment is not None
        else []
    )
    if len(found) != 1:
        outcome.problems.append(f"MLflow: {len(found)} runs for the registry run, not 1")
        return
    run = found[0]
    outcome.mlflow_status = run.info.status
    if run.info.status != "FINISHED":
        outcome.problems.append(f"MLflow status {run.info.status}")
    metric = int(run.data.metrics.get("rollouts", -1))
    outcome.counts["mlflow metric"] = metric
    if metric != total:
        outcome.problems.append(f"MLflow rollouts metric {metric}, not {total}")
    artifact = Path(run.info.artifact_uri.removeprefix("file://")) / "rollouts.parquet"
    try:
        table = pq.read_table(artifact, columns=["example_id", "rollout_index"])
    except Exception as exc:
        outcome.counts["mlflow parquet"] = -1
        outcome.problems.append(f"MLflow rollouts.parquet unreadable: {exc}")
        return
    keys = set(
        zip(table["example_id"].to_pylist(), table["rollout_index"].to_pylist(), strict=True)
    )
    _expect(outcome, "mlflow parquet", table.num_rows, len(keys), total)


def kill_during_store_creation(
    work: Path, *, db_url: str, site: Path, base_url: str, examples: int, grown_to: int
) -> tuple[int, Outcome]:
    """kill -9 the eval's whole tree while its tracker creates the embedded MLflow store
    (once the store's file, final or temporary, has ``grown_to`` bytes: mid-migration),
    then run a new eval in that home; returns the first's exit and the second's outcome."""
    home, out = work / "home", work / "out"
    home.mkdir(parents=True, exist_ok=True)
    env = cli_env(home, db_url, site)
    store = home / "mlflow"

    def creating() -> bool:
        return any(
            path.stat().st_size >= grown_to
            for path in (list(store.glob("mlflow.db")) + list(store.glob(".mlflow.db.*.tmp")))
            if path.exists()
        )

    args = eval_args(base_url, out, examples, 1)
    process = start(args, env, work / "first.log")
    try:
        wait_for(lambda: creating() or process.poll() is not None, "the store's creation")
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        first = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    second_out = work / "again"
    second = subprocess.run(
        [sys.executable, "-m", "vfops", *eval_args(base_url, second_out, examples, 1)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    outcome = Outcome(mode="tree", at="store creation", resume_exit=second.returncode)
    outcome.stderr = second.stderr[-2000:]
    if second.returncode != 0:
        outcome.problems.append(f"the next eval exited {second.returncode}")
        return first, outcome
    run_dir = run_dir_of(second_out)
    assert run_dir is not None
    count_stores(outcome, run_dir, db_url, home, examples)
    return first, outcome
