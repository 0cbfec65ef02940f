"""kill -9 of a tracked ``vfops eval`` (the main process, its whole tree, its tracker
only) followed at once by ``--resume``: every store exact. The tracker's lock and
lifeline, the MLflow holder fence, the embedded store's atomic creation, and the
Arrow export's check at load. The long matrix is bench/crash_matrix.py.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.crash_harness import (
    cli_env,
    crash_and_resume,
    eval_args,
    kill_during_store_creation,
    run_dir_of,
    start,
    wait_for,
)
from tests.registry_fixtures import make_record
from vfops._errors import VfopsError
from vfops.testing import StubConfig, StubServer

pytestmark = pytest.mark.tracking

EXAMPLES, PER_EXAMPLE = 1000, 2  # 2,000 rollouts


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(reply_mode="echo_answer")) as server:
        yield server


@pytest.mark.parametrize(
    ("mode", "at"),
    [("main", 0.3), ("main", 1.0), ("tree", 0.5), ("tracker", 0.5)],
    ids=["main-30%", "main-end", "tree-50%", "tracker-50%"],
)
def test_kill_9_then_resume_at_once_is_exact_in_every_store(
    tmp_path: Path, env_site: Path, stub: StubServer, mode: str, at: float
) -> None:
    """2,000 rollouts; kill -9 once ``at`` of them are on disk, ``--resume`` at once (the
    killed run's tracker may still be alive): 2,000 rows once each in results.jsonl,
    rollouts.arrow (readable as it is), the registry and MLflow's rollouts.parquet;
    completed and FINISHED."""
    outcome = crash_and_resume(
        tmp_path,
        db_url=f"sqlite:///{tmp_path / 'registry.db'}",
        site=env_site,
        base_url=stub.base_url,
        mode=mode,  # type: ignore[arg-type]
        at_fraction=at,
        examples=EXAMPLES,
        rollouts=PER_EXAMPLE,
    )
    assert outcome.exact, (outcome.problems, outcome.stderr)
    assert outcome.status == "completed" and outcome.mlflow_status == "FINISHED"


def test_kill_9_while_the_store_is_created_leaves_a_home_the_next_eval_tracks(
    tmp_path: Path, env_site: Path, stub: StubServer
) -> None:
    """The whole tree killed once the tracker's new MLflow store is mid-migration (its
    file past 300 KB of ~950): no half-created store is left, and the next eval in
    that home exits 0, tracked (FINISHED, every rollout)."""
    first, outcome = kill_during_store_creation(
        tmp_path,
        db_url=f"sqlite:///{tmp_path / 'registry.db'}",
        site=env_site,
        base_url=stub.base_url,
        examples=10,
        grown_to=300_000,
    )
    assert first == -signal.SIGKILL
    assert outcome.exact, (outcome.problems, outcome.stderr)
    assert outcome.mlflow_status == "FINISHED"


def _half_created_by_mlflow(path: Path, grown_to: int = 300_000) -> None:
    """What an older vfops (or MLflow itself) left: the schema created in place, killed
    mid-migration."""
    code = (
        "import sys; from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore; "
        "SqlAlchemyStore(sys.argv[1], sys.argv[2])"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, f"sqlite:///{path}", (path.parent / "art").as_uri()]
    )
    try:
        wait_for(
            lambda: (path.exists() and path.stat().st_size >= grown_to) or process.poll(),
            "the store mid-migration",
        )
    finally:
        process.kill()
        process.wait()
    tables = sqlite3.connect(path).execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    assert tables > 0  # partly there


def test_a_store_half_created_in_place_is_rebuilt_before_the_run(
    tmp_path: Path, env_site: Path, stub: StubServer
) -> None:
    """The failure of the issue: a store killed mid-creation in place broke the home for
    good (``table ... already exists``). It held nothing: it is moved aside, created
    again whole, and the eval exits 0, tracked."""
    home = tmp_path / "home"
    store = home / "mlflow" / "mlflow.db"
    store.parent.mkdir(parents=True)
    _half_created_by_mlflow(store)
    env = cli_env(home, f"sqlite:///{tmp_path / 'registry.db'}", env_site)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "vfops", *eval_args(stub.base_url, out, 5, 1)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "half-created" in done.stderr and "moved to mlflow.db.broken-" in done.stderr
    run_dir = run_dir_of(out)
    assert run_dir is not None
    metadata = orjson.loads((run_dir / "metadata.json").read_bytes())
    assert metadata["status"] == "completed" and metadata["mlflow_run_id"]
    assert list(store.parent.glob("mlflow.db.broken-*"))  # kept, not deleted


def test_a_store_with_runs_at_another_schema_is_refused_before_any_model_call(
    tmp_path: Path, env_site: Path
) -> None:
    """A store that holds runs but is not at this MLflow's schema cannot be rebuilt: one
    line naming the real fix (``mlflow db upgrade``, not MLFLOW_TRACKING_URI), exit 1,
    before the endpoint gets a single rollout request."""
    home = tmp_path / "home"
    store = home / "mlflow" / "mlflow.db"
    store.parent.mkdir(parents=True)
    _half_created_by_mlflow(store)
    with sqlite3.connect(store) as connection:  # a run recorded in it
        connection.execute(
            "INSERT INTO runs (run_uuid, experiment_id, status, lifecycle_stage) "
            "VALUES ('r1', 0, 'FINISHED', 'active')"
        )
    env = cli_env(home, f"sqlite:///{tmp_path / 'registry.db'}", env_site)
    with StubServer(StubConfig(reply_mode="echo_answer")) as stub:
        done = subprocess.run(
            [sys.executable, "-m", "vfops", *eval_args(stub.base_url, tmp_path / "o", 5, 1)],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        chat_requests = stub.stats["requests"]
    assert done.returncode != 0
    assert chat_requests == 0
    lines = [line for line in done.stderr.splitlines() if "mlflow db upgrade" in line]
    assert len(lines) == 1 and str(store) in lines[0], done.stderr
    assert "Traceback" not in done.stderr and "MLFLOW_TRACKING_URI" not in lines[0]


def test_a_resume_waits_for_the_tracker_of_a_dead_holder_and_names_it(
    tmp_path: Path, env_site: Path
) -> None:
    """A process holding RUN_DIR/.tracker.lock (a killed eval's tracker still writing)
    keeps a resume out: bounded by VFOPS_TRACKER_EXIT_WAIT_S, exit 4 in one line naming
    its pid, no model call, nothing written; once it is gone the resume completes."""
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    env = cli_env(tmp_path / "home", db_url, env_site)
    env["VFOPS_TRACKING"] = "0"  # the lock matters whatever records the run
    out = tmp_path / "out"
    # every request held for an hour: the first run is killed with its rollouts in flight
    with StubServer(StubConfig(reply_mode="echo_answer", latency_ms=3_600_000)) as stub:
        args = eval_args(stub.base_url, out, 5, 1)
        first = start(args, env, tmp_path / "first.log")
        run_dir = wait_for(
            lambda: (found := run_dir_of(out)) and (found / "metadata.json").exists() and found,
            "the run folder",
        )
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        holder = subprocess.Popen(
            [sys.executable, "-c",
             "import sys, time; from pathlib import Path; "
             "from vfops.tracking._lifeline import hold_run_folder; "
             "hold_run_folder(Path(sys.argv[1])); print('held', flush=True); time.sleep(600)",
             str(run_dir)],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
            before = stub.stats["requests"]
            results = (run_dir / "results.jsonl").read_bytes()
            waited = subprocess.run(
                [sys.executable, "-m", "vfops", *args, "--resume", str(run_dir)],
                env={**env, "VFOPS_TRACKER_EXIT_WAIT_S": "1"},
                capture_output=True, text=True, timeout=300, check=False,
            )  # fmt: skip
            assert waited.returncode == 4, waited.stderr
            assert f"pid {holder.pid}" in waited.stderr and f"kill {holder.pid}" in waited.stderr
            assert "Traceback" not in waited.stderr
            assert stub.stats["requests"] == before
            assert (run_dir / "results.jsonl").read_bytes() == results
        finally:
            holder.kill()
            holder.wait()
            assert holder.stdout is not None
            holder.stdout.close()
        stub.config.latency_ms = 0
        resumed = subprocess.run(
            [sys.executable, "-m", "vfops", *args, "--resume", str(run_dir)],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr


def test_the_lifeline_tells_at_once_that_the_parent_died(tmp_path: Path) -> None:
    """A child's Lifeline is gone right after its parent is killed with -9, not at the
    next read of its input: the kernel's signal (PR_SET_PDEATHSIG) tells it, the
    getppid watch (slowed to an hour here) is only the fallback."""
    report = tmp_path / "gone"
    child = (
        "import os, sys, time; import vfops.tracking._lifeline as lifeline; "
        "lifeline._WATCH_EVERY_S = 3600; "
        "life = lifeline.Lifeline(os.getppid()); print(os.getpid(), flush=True); "
        "[time.sleep(0.01) for _ in iter(lambda: life.gone(), True)]; "
        "open(sys.argv[1], 'w').write(str(time.monotonic()))"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1], "
         "sys.argv[2]]); p.wait()", child, str(report)],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert parent.stdout is not None
    with parent.stdout:
        child_pid = int(parent.stdout.readline())
    killed = time.monotonic()
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    told = float(wait_for(lambda: report.exists() and report.read_text(), "the child to tell"))
    assert told - killed < 5.0  # the signal, not the watch
    wait_for(lambda: not Path(f"/proc/{child_pid}").exists() or _zombie(child_pid), "its end")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_mlflow_run_ends_are_fenced_by_the_holder_tag(tmp_path: Path) -> None:
    """The holder that opened an MLflow run ends it only while the run's holder tag still
    names it: once another holder reopened it, neither the old finish nor the old
    tracker's KILLED writes anything."""
    from vfops.tracking import mlflow_client
    from vfops.tracking._eval_runs import end_killed, finish_mlflow_run, open_mlflow_run
    from vfops.tracking._lifeline import RunTakenOver

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        info = {
            "id": "a" * 32, "env_name": "echo_env", "env_version": "0.0.1",
            "code_hash": "x", "published": False, "model": "m", "sampling_args": {},
            "env_args": {}, "num_examples": 1, "rollouts_per_example": 1,
            "status": "running", "started_at": "2026-01-01T00:00:00+00:00",
            "finished_at": None, "summary": {}, "vfops_version": "0", "tags": [],
            "mlflow_run_id": None,
        }  # fmt: skip
        old = open_mlflow_run(info, holder="host@1:old")
        new = open_mlflow_run(info, holder="host@2:new")
        assert new.mlflow_run_id == old.mlflow_run_id
        ended = {**info, "status": "failed", "finished_at": "2026-01-01T00:01:00+00:00"}
        with pytest.raises(RunTakenOver, match="host@2:new"):
            finish_mlflow_run(old, ended, rollouts_file=None, holder="host@1:old")
        assert end_killed(old.mlflow_run_id, "host@1:old") is False
        run = mlflow_client(uri).get_run(old.mlflow_run_id)
        assert run.info.status == "RUNNING" and run.data.tags["vfops.status"] == "running"
        finish_mlflow_run(new, {**ended, "status": "completed"}, rollouts_file=None,
                          holder="host@2:new")  # fmt: skip
        assert mlflow_client(uri).get_run(old.mlflow_run_id).info.status == "FINISHED"
    finally:
        del os.environ["MLFLOW_TRACKING_URI"]


def _run_folder(tmp_path: Path, rows: int) -> Path:
    from vfops._arrow import ResultsExport

    records = [make_record(i, 0) for i in range(rows)]
    (tmp_path / "results.jsonl").write_bytes(b"".join(r.to_json() + b"\n" for r in records))
    export = ResultsExport(tmp_path / "rollouts.arrow")
    export.add(records)
    export.seal()
    return tmp_path


@pytest.mark.parametrize("damage", ["torn", "interleaved", "stale"])
def test_load_results_rebuilds_a_damaged_export_from_results_jsonl(
    tmp_path: Path, damage: str
) -> None:
    """A rollouts.arrow cut short, written over by a second writer (the issue's two
    trackers: a batch's header where the other's body was), or holding fewer rows than
    results.jsonl (a session killed before it sealed) is found at load and rebuilt from
    results.jsonl, the source of truth."""
    from vfops.evaluation import load_results

    run_dir = _run_folder(tmp_path, 50)
    arrow = run_dir / "rollouts.arrow"
    data = arrow.read_bytes()
    if damage == "torn":
        arrow.write_bytes(data[: len(data) // 2])
    elif damage == "interleaved":
        middle = len(data) // 2
        arrow.write_bytes(data[:middle] + data[: len(data) - middle])
    else:
        extra = make_record(50, 0)
        with (run_dir / "results.jsonl").open("ab") as handle:
            handle.write(extra.to_json() + b"\n")
    rows = load_results(run_dir)
    expected = 51 if damage == "stale" else 50
    assert sorted(rows["example_id"]) == list(range(expected))
    assert not list(run_dir.glob(".rollouts.arrow.*"))  # no temporary file left


def test_load_results_refuses_a_damaged_export_it_cannot_rebuild(tmp_path: Path) -> None:
    from vfops.evaluation import load_results

    run_dir = _run_folder(tmp_path, 5)
    (run_dir / "results.jsonl").unlink()
    arrow = run_dir / "rollouts.arrow"
    arrow.write_bytes(arrow.read_bytes()[:100])
    with pytest.raises(VfopsError) as raised:
        load_results(run_dir)
    message = str(raised.value)
    assert "\n" not in message and "cannot be read" in message
    assert "vfops runs export" in message


def test_an_export_killed_midway_leaves_only_a_temporary_file_the_next_writer_removes(
    tmp_path: Path,
) -> None:
    """Two writers never share a file (each has its own temporary name), and the
    temporary file of one that died is removed by the next."""
    from vfops._arrow import ResultsExport

    path = tmp_path / "rollouts.arrow"
    dead = ResultsExport(path, batch_rows=1)
    dead.add([make_record(0, 0)])  # written, never sealed: its writer was killed
    assert dead.partial is not None and dead.partial.exists()
    live = ResultsExport(path, batch_rows=1)
    live.add([make_record(1, 0)])
    assert live.partial != dead.partial and not dead.partial.exists()
    live.seal()
    assert [p.name for p in tmp_path.iterdir()] == ["rollouts.arrow"]
