"""``vfops eval`` recorded in the registry: exactly-once after kill -9, runs CLI, secrets.

Every test runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from datasets import load_from_disk
from sqlalchemy import make_url, text

from tests.registry_fixtures import DIALECTS, database_url, stored_count, stored_rollouts
from tests.request_gate import RequestGate
from tests.tcp_proxy import TcpProxy
from vfops.registry import get_engine
from vfops.testing import StubConfig, StubServer
from vfops.tracking import mlflow_client

pytestmark = pytest.mark.tracking  # what these tests check is in MLflow (tests/conftest.py)


@pytest.fixture(params=DIALECTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path)


def cli_env(db_url: str, site: Path, **extra: str) -> dict[str, str]:
    # COLUMNS: rich sizes tables to the terminal, 80 columns when there is none
    return {
        **os.environ,
        "VFOPS_DATABASE_URL": db_url,
        "PYTHONPATH": str(site),
        "COLUMNS": "200",
        **extra,
    }


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vfops", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def only_run_id(db_url: str) -> str:
    with get_engine(db_url).connect() as connection:
        (run_id,) = connection.execute(text("SELECT id FROM eval_runs")).scalars()
    return str(run_id)


def _kill_9_mid_run(
    args: list[str],
    env: dict[str, str],
    tmp_path: Path,
    db_url: str,
    *,
    rows_in_registry: bool = False,
) -> Path:
    """Start ``vfops eval``, SIGKILL it once rollouts are on disk and the registry holds
    the run (it is opened while the first rollouts run) and, with ``rows_in_registry``,
    some of its rollouts; return results.jsonl."""
    process = subprocess.Popen(
        [sys.executable, "-m", "vfops", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    results = _wait_until_mid_run(tmp_path, db_url, rows_in_registry=rows_in_registry)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    return results


def _wait_until_mid_run(tmp_path: Path, db_url: str, *, rows_in_registry: bool) -> Path:
    deadline = time.monotonic() + 300  # a safety net: it returns on the state
    while time.monotonic() < deadline:
        found = list(tmp_path.glob("evals/*/*/results.jsonl"))
        going = found and found[0].stat().st_size > 20_000 and _run_count(db_url) == 1
        if going and (not rows_in_registry or _rollout_count(db_url) > 0):
            return found[0]
        time.sleep(0.05)
    raise AssertionError("the run never got going")


def _rollout_count(db_url: str) -> int:
    with get_engine(db_url).connect() as connection:
        return int(connection.execute(text("SELECT count(*) FROM rollouts")).scalar_one())


def _run_count(db_url: str) -> int:
    with get_engine(db_url).connect() as connection:
        return int(connection.execute(text("SELECT count(*) FROM eval_runs")).scalar_one())


def _kill_args(base_url: str, tmp_path: Path) -> list[str]:
    return [
        "eval", "echo_env", "-a", '{"num_examples": 150}', "-m", "stub-model",
        "-b", base_url, "-n", "150", "-r", "2", "-c", "16", "-o", str(tmp_path),
    ]  # fmt: skip


def _assert_exactly_once(db_url: str, run_id: str) -> None:
    engine = get_engine(db_url)
    keys = [(r.example_id, r.rollout_index) for r in stored_rollouts(engine, run_id)]
    assert len(keys) == len(set(keys)) == 300 == stored_count(engine, run_id)
    with engine.connect() as connection:
        status = connection.execute(text("SELECT status FROM eval_runs")).scalar_one()
    assert status == "completed"


def test_kill_9_then_resume_gives_exactly_n_times_r(
    db_url: str, env_site: Path, tmp_path: Path
) -> None:
    env = cli_env(db_url, env_site)
    get_engine(db_url)  # the schema exists, as for any run but a machine's first
    # ~4 s of rollouts: killed once the registry holds some and the folder more
    with StubServer(StubConfig(reply_mode="echo_answer", latency_ms=200)) as stub:
        args = _kill_args(stub.base_url, tmp_path)
        results = _kill_9_mid_run(args, env, tmp_path, db_url, rows_in_registry=True)
        run_id = only_run_id(db_url)
        assert 0 < stored_count(get_engine(db_url), run_id) < 300
        lines = results.read_bytes().splitlines()
        on_disk = len(lines) - (not lines[-1].endswith(b"}"))  # a torn last line is redone
        asked = stub.stats["requests"]
        resumed = run(*args, "--resume", run_id, env=env)
        assert resumed.returncode == 0, resumed.stderr
        # resume generated only what the folder did not hold; a request the killed
        # process sent may be counted late: at most its in-flight (-c 16) more
        missing = 300 - on_disk
        assert missing <= stub.stats["requests"] - asked <= missing + 16
    _assert_exactly_once(db_url, run_id)


@pytest.mark.parametrize("tracking", ["1", "0"], ids=["by-the-tracker", "in-process"])
def test_an_arrow_export_that_cannot_be_written_fails_the_run_and_resume_writes_it(
    db_url: str, env_site: Path, tmp_path: Path, tracking: str
) -> None:
    """``rollouts.arrow`` is written by the tracker of a tracked eval (from the
    results.jsonl it reads anyway) and in the evaluating process otherwise; either way a
    folder that refuses it fails the run in one line naming the file and the fix, and
    --resume writes it whole (from all of results.jsonl), with MLflow's count too."""
    env = cli_env(db_url, env_site, VFOPS_TRACKING=tracking)
    get_engine(db_url)
    with StubServer(StubConfig(reply_mode="echo_answer", latency_ms=200)) as stub:
        args = _kill_args(stub.base_url, tmp_path)
        results = _kill_9_mid_run(args, env, tmp_path, db_url)
        run_id = only_run_id(db_url)
        run_dir = results.parent
        blocked = run_dir / "rollouts.arrow"  # where the export is renamed to
        blocked.unlink(missing_ok=True)
        blocked.mkdir()  # a rename onto a folder fails (IsADirectoryError)
        refused = run(*args, "--resume", run_id, env=env)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        (line,) = refused.stderr.strip().splitlines()
        # the export is named, with its fix: not taken for an MLflow failure
        assert "export (rollouts.arrow): could not write" in line, line
        assert "make room in the output folder" in line and f"--resume {run_id}" in line, line
        assert "MLFLOW_TRACKING_URI" not in line, line
        assert blocked.is_dir() and not list(blocked.iterdir())  # nothing half-written
        blocked.rmdir()
        resumed = run(*args, "--resume", run_id, env=env)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert not list(run_dir.glob(".rollouts.arrow.*"))  # the temporary files are gone
    _assert_exactly_once(db_url, run_id)
    from vfops.evaluation import load_results

    exported = load_results(run_dir)
    assert len(exported) == 300
    assert len({(r["example_id"], r["rollout_index"]) for r in exported}) == 300
    metadata = orjson.loads((run_dir / "metadata.json").read_bytes())
    assert ("mlflow_run_id" in metadata) == (tracking == "1")
    if tracking == "1":
        logged = mlflow_client().get_run(metadata["mlflow_run_id"])
        assert logged.info.status == "FINISHED" and logged.data.metrics["rollouts"] == 300


def test_a_tracked_eval_never_imports_pyarrow_and_its_tracker_writes_the_export(
    env_site: Path, tmp_path: Path
) -> None:
    """The evaluating process of a tracked eval leaves pyarrow (and numpy) to its tracker,
    which writes ``rollouts.arrow`` and serves the registry calls too (one recorder
    process: no registry child); untracked, the evaluation writes it itself and its
    registry calls go to a registry child."""
    from vfops.evaluation import load_results
    from vfops.registry import SERVICE

    db_url = f"sqlite:///{tmp_path / 'home' / 'registry.db'}"  # either dialect would do
    # every Python process of the tree writes its command line here (sys.orig_argv)
    spy = tmp_path / "spy"
    spy.mkdir()
    (spy / "sitecustomize.py").write_text(
        "import os, sys\n"
        "if os.environ.get('ARGV_LOG'):\n"
        "    with open(os.environ['ARGV_LOG'], 'a') as log:\n"
        "        log.write(' '.join(sys.orig_argv) + '\\n')\n"
    )
    with StubServer(StubConfig(reply_mode="arithmetic")) as stub:
        for tracking in ("1", "0"):
            out = tmp_path / f"out-{tracking}"
            argv_log = tmp_path / f"argv-{tracking}.log"
            env = cli_env(db_url, env_site, VFOPS_TRACKING=tracking, ARGV_LOG=str(argv_log))
            env["PYTHONPATH"] = f"{env['PYTHONPATH']}{os.pathsep}{spy}"
            done = subprocess.run(
                # arithmetic: an environment of plain rows (a datasets one imports pyarrow)
                [sys.executable, "-X", "importtime", "-m", "vfops", "eval", "arithmetic",
                 "-a", '{"num_examples": 40}', "-m", "stub-model", "-b", stub.base_url,
                 "-n", "40", "-r", "2", "-o", str(out)],
                capture_output=True, text=True, timeout=300, check=False, env=env,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr[-2000:]
            # -X importtime is this process's alone (its children run without it)
            imported = {
                line.rsplit("|", 1)[-1].strip()
                for line in done.stderr.splitlines()
                if line.startswith("import time:")
            }
            assert ("pyarrow" in imported) == (tracking == "0"), tracking
            (metadata,) = out.glob("evals/*/*/metadata.json")
            assert len(load_results(metadata.parent)) == 80
            children = argv_log.read_text().splitlines()[1:]  # the first is vfops itself
            if tracking == "1":
                (tracker,) = children
                assert "-m vfops.tracking._tracker_main arithmetic" in tracker
                assert f"--side-service {SERVICE} " in tracker
            else:
                (child,) = children
                assert child.endswith("-m vfops.registry._service_child")
    with get_engine(db_url).connect() as connection:
        rows = connection.execute(
            text(
                "SELECT r.mlflow_run_id, r.status, (SELECT count(*) FROM rollouts o "
                "WHERE o.run_id = r.id) FROM eval_runs r ORDER BY r.started_at"
            )
        ).all()
    # both recorded at exit: the tracked one linked to its MLflow run
    assert [(row[0] is not None, row[1], row[2]) for row in rows] == [
        (True, "completed", 80),
        (False, "completed", 80),
    ]


def _signal_in_order(process: subprocess.Popen[str], signals: list[signal.Signals]) -> str:
    """Send ``signals[0]``, then the others once the process has said it took the first
    (its "interrupted by" line), and return its stderr. Sent back to back, two signals
    can both be pending at once; the kernel then hands them to different threads (or the
    handlers run in reverse), and the order the process sees is the test's luck (CI saw
    SIGINT first from SIGTERM-then-SIGINT)."""
    assert process.stderr is not None
    first, *later = signals
    process.send_signal(first)
    seen: list[str] = []
    if later:
        # pytest-timeout is the safety net: the line comes, or stderr ends at its exit
        for line in process.stderr:
            seen.append(line)
            if line.startswith("interrupted by"):
                break
        for signum in later:
            process.send_signal(signum)
    _, rest = process.communicate(timeout=120)
    return "".join(seen) + rest


@pytest.mark.parametrize(
    "signals",
    [[signal.SIGTERM], [signal.SIGINT, signal.SIGINT], [signal.SIGTERM, signal.SIGINT]],
    ids=["sigterm", "sigint-twice", "sigterm-then-sigint"],
)
def test_signals_mid_run_are_interrupted_flushed_and_resumable(
    db_url: str, env_site: Path, tmp_path: Path, signals: list[signal.Signals]
) -> None:
    """SIGTERM (what workers and orchestrators send) is handled like SIGINT, and a second
    signal (a double Ctrl-C, ``timeout -s INT``) does not cut the recording short: exit
    128 + the first signal, status interrupted in the registry, the folder and MLflow,
    every row on disk also in the registry, and --resume completes to exactly N x R
    generating only what is missing."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/m.db"
    env = cli_env(db_url, env_site, MLFLOW_TRACKING_URI=uri)
    get_engine(db_url)
    with StubServer(StubConfig(reply_mode="echo_answer", latency_ms=200)) as stub:
        args = _kill_args(stub.base_url, tmp_path)
        process = subprocess.Popen(
            [sys.executable, "-m", "vfops", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        results = _wait_until_mid_run(tmp_path, db_url, rows_in_registry=True)
        stderr = _signal_in_order(process, signals)
        assert process.returncode == 128 + signals[0], stderr
        assert "Traceback" not in stderr and "interrupted" in stderr and "--resume" in stderr
        # the first signal was taken at once, and a second one while the run was recorded
        assert f"interrupted by {signals[0].name}:" in stderr
        assert ("recording the run's end" in stderr) == (len(signals) > 1)
        run_id = only_run_id(db_url)
        on_disk = len(results.read_bytes().splitlines())
        assert 0 < on_disk < 300
        assert stored_count(get_engine(db_url), run_id) == on_disk  # every row flushed
        with get_engine(db_url).connect() as connection:
            status = connection.execute(text("SELECT status FROM eval_runs")).scalar_one()
        assert status == "interrupted"
        metadata = orjson.loads((results.parent / "metadata.json").read_bytes())
        assert metadata["status"] == "interrupted"
        mlflow_id = _mlflow_run_of(uri, run_id)
        assert mlflow_id is not None
        assert MlflowClient(uri).get_run(mlflow_id).info.status == "KILLED"
        asked = stub.stats["requests"]
        resumed = run(*args, "--resume", run_id, env=env)
        assert resumed.returncode == 0, resumed.stderr
        assert stub.stats["requests"] - asked == 300 - on_disk
    _assert_exactly_once(db_url, run_id)
    finished = MlflowClient(uri).get_run(mlflow_id)  # the same MLflow run, finished
    assert finished.info.status == "FINISHED" and finished.data.metrics["rollouts"] == 300
    assert _mlflow_link(db_url) == ("completed", mlflow_id)


def _lease_owner(db_url: str) -> str | None:
    with get_engine(db_url).connect() as connection:
        owner = connection.execute(text("SELECT lease_owner FROM eval_runs")).scalar_one()
    return None if owner is None else str(owner)


def _lease_expiry(db_url: str) -> object:
    with get_engine(db_url).connect() as connection:
        return connection.execute(text("SELECT lease_expires FROM eval_runs")).scalar_one()


def test_two_concurrent_resumes_of_one_run_the_second_is_refused(
    db_url: str, env_site: Path, tmp_path: Path
) -> None:
    """A run killed mid-way (its dead process's lease is taken over), resumed twice at
    once: the second exits at once, naming the first; the first completes it exactly,
    and the endpoint is asked only for the missing rollouts."""
    env = cli_env(db_url, env_site, VFOPS_TRACKING="0")
    get_engine(db_url)
    # slow rollouts: the kill lands mid-run (the resumes are held at a gate below)
    with StubServer(StubConfig(reply_mode="echo_answer", latency_ms=500)) as stub:
        args = _kill_args(stub.base_url, tmp_path)
        results = _kill_9_mid_run(args, env, tmp_path, db_url, rows_in_registry=True)
        run_id = only_run_id(db_url)
        lines = results.read_bytes().splitlines()
        on_disk = len(lines) - (not lines[-1].endswith(b"}"))
        asked = stub.stats["requests"]
        # the first resume's model calls wait at a closed gate until the second has been
        # refused: "while the first is working" is a state, not a bet on its ~8 s (under
        # load, the second's start took longer than the first's whole run)
        with RequestGate(stub) as gate:
            first = subprocess.Popen(
                [sys.executable, "-m", "vfops", *args, "--resume", run_id],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            deadline = time.monotonic() + 240  # a safety net: it returns on the state
            while f"@{first.pid}:" not in (_lease_owner(db_url) or ""):
                assert time.monotonic() < deadline and first.poll() is None, "no lease taken"
                time.sleep(0.05)
            try:  # a second resume that is not refused waits at the gate: it never returns
                second = subprocess.run(
                    [sys.executable, "-m", "vfops", *args, "--resume", run_id],
                    capture_output=True, text=True, env=env, timeout=120, check=False,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                pytest.fail("the second resume ran while the first held the run (not refused)")
            assert first.poll() is None  # it was refused while the first was working
            gate.open()
            _, first_err = first.communicate(timeout=120)
        assert first.returncode == 0, first_err
    assert second.returncode == 4, second.stderr
    (line,) = second.stderr.strip().splitlines()
    assert line.startswith(f"error: run {run_id} is being worked on by pid {first.pid} on host")
    assert "wait for it to end" in line
    assert len(results.read_bytes().splitlines()) == 300
    missing = 300 - on_disk  # a request of the killed process may be counted late
    assert missing <= stub.stats["requests"] - asked <= missing + 16
    _assert_exactly_once(db_url, run_id)
    assert _lease_expiry(db_url) is None  # released at the end


def test_a_run_killed_before_it_was_recorded_resumes_from_its_folder(
    db_url: str, env_site: Path, tmp_path: Path
) -> None:
    """The registry opens a new run while its first rollouts run: a kill before the
    run is recorded leaves only the folder, which --resume RUN_DIR records and completes
    (simulated exactly by deleting the run after the kill)."""
    env = cli_env(db_url, env_site, VFOPS_TRACKING="0")
    get_engine(db_url)
    with StubServer(StubConfig(reply_mode="echo_answer", latency_ms=50)) as stub:
        args = _kill_args(stub.base_url, tmp_path)
        results = _kill_9_mid_run(args, env, tmp_path, db_url)
        run_id = only_run_id(db_url)
        with get_engine(db_url).begin() as connection:
            connection.execute(text("DELETE FROM rollouts"))
            connection.execute(text("DELETE FROM eval_runs"))
        by_id = run(*args, "--resume", run_id, env=env)
        assert by_id.returncode == 2 and "--resume RUN_DIR" in by_id.stderr, by_id.stderr
        on_disk = len(results.read_bytes().splitlines())
        asked = stub.stats["ok"]
        resumed = run(*args, "--resume", str(results.parent), env=env)
        assert resumed.returncode == 0, resumed.stderr
        # only what the folder did not hold was generated (a torn last line, at most, again)
        assert stub.stats["ok"] - asked <= 300 - on_disk + 1
    assert only_run_id(db_url) == run_id
    _assert_exactly_once(db_url, run_id)


def _install_insert_fault(db_url: str, allowed_rows: int) -> None:
    """A database-side fault: inserting rollouts fails once the table holds ``allowed_rows``."""
    engine = get_engine(db_url)
    with engine.begin() as connection:
        if engine.dialect.name == "sqlite":
            connection.execute(
                text(
                    "CREATE TRIGGER injected_fault BEFORE INSERT ON rollouts "
                    f"WHEN (SELECT count(*) FROM rollouts) >= {allowed_rows} "
                    "BEGIN SELECT RAISE(ABORT, 'injected fault'); END"
                )
            )
            return
        connection.execute(
            text(
                "CREATE FUNCTION injected_fault() RETURNS trigger AS $$ BEGIN "
                f"IF (SELECT count(*) FROM rollouts) >= {allowed_rows} THEN "
                "RAISE EXCEPTION 'injected fault'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
            )
        )
        connection.execute(
            text(
                "CREATE TRIGGER injected_fault BEFORE INSERT ON rollouts "
                "FOR EACH ROW EXECUTE FUNCTION injected_fault()"
            )
        )


def _remove_insert_fault(db_url: str) -> None:
    engine = get_engine(db_url)
    with engine.begin() as connection:
        connection.execute(
            text(
                "DROP TRIGGER injected_fault"
                + ("" if engine.dialect.name == "sqlite" else " ON rollouts")
            )
        )


def test_a_failing_registry_write_fails_the_run_and_resume_completes_it(
    db_url: str, env_site: Path, tmp_path: Path
) -> None:
    """The registry sink fails mid-run: non-zero exit, status failed, nothing swallowed;
    --resume then sends the rows on disk and generates only what is missing."""
    env = cli_env(db_url, env_site, VFOPS_TRACKING="0")
    get_engine(db_url)  # the schema, so the trigger has a table to sit on
    _install_insert_fault(db_url, allowed_rows=1)
    # ~2.5 s of rollouts: the registry writer's first flush (after 1 s) hits the fault
    with StubServer(StubConfig(reply_mode="echo_answer", latency_ms=50)) as stub:
        args = [
            "eval", "echo_env", "-a", '{"num_examples": 100}', "-m", "stub-model",
            "-b", stub.base_url, "-n", "100", "-r", "2", "-c", "4", "-o", str(tmp_path),
        ]  # fmt: skip
        failed = run(*args, env=env)
        assert failed.returncode == 1, failed.stderr
        assert "registry: could not store rollouts" in failed.stderr
        assert "--resume" in failed.stderr and "Traceback" not in failed.stderr
        run_id = only_run_id(db_url)
        engine = get_engine(db_url)
        with engine.connect() as connection:
            status = connection.execute(text("SELECT status FROM eval_runs")).scalar_one()
        assert status == "failed"
        stored = stored_count(engine, run_id)
        (results,) = tmp_path.glob("evals/*/*/results.jsonl")
        on_disk = len(results.read_bytes().splitlines())
        assert stored < on_disk < 200  # stopped early; the folder kept what the registry refused
        asked_before = stub.stats["ok"]

        _remove_insert_fault(db_url)
        resumed = run(*args, "--resume", run_id, env=env)
        assert resumed.returncode == 0, resumed.stderr
        # only the rollouts the folder did not hold were generated again
        assert stub.stats["ok"] - asked_before == 200 - on_disk
    keys = [(r.example_id, r.rollout_index) for r in stored_rollouts(engine, run_id)]
    assert len(keys) == len(set(keys)) == 200 == stored_count(engine, run_id)
    assert len(results.read_bytes().splitlines()) == 200
    with engine.connect() as connection:
        assert connection.execute(text("SELECT status FROM eval_runs")).scalar_one() == "completed"


def _mlflow_link(db_url: str) -> tuple[str, str | None]:
    with get_engine(db_url).connect() as connection:
        row = connection.execute(text("SELECT status, mlflow_run_id FROM eval_runs")).one()
    return str(row[0]), row[1]


def _unwritable_artifacts(tmp_path: Path) -> str:
    """An artifact root MLflow accepts for a new experiment but cannot write into (it
    lies under a regular file: even root cannot create it), so logging fails late."""
    (tmp_path / "a-file").write_text("not a folder")
    return str(tmp_path / "a-file" / "artifacts")


def _mlflow_failing_late(db_url: str, env_site: Path, tmp_path: Path) -> dict[str, str]:
    """A CLI environment whose MLflow store opens but cannot store the run's artifact."""
    return cli_env(
        db_url,
        env_site,
        MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/broken.db",
        VFOPS_MLFLOW_ARTIFACTS=_unwritable_artifacts(tmp_path),
    )


def test_a_broken_mlflow_store_is_refused_before_anything_is_recorded(
    db_url: str, env_site: Path, tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    broken = cli_env(db_url, env_site, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/a-file/m.db")
    with StubServer(StubConfig(reply_mode="echo_answer")) as stub:
        args = ["eval", "echo_env", "-m", "stub-model", "-b", stub.base_url, "-n", "5"]
        failed = run(*args, "-o", str(tmp_path / "out"), env=broken)
        assert stub.stats["ok"] == 0
    assert failed.returncode == 2, failed.stderr  # bad input: refused before it ran
    assert "cannot open the MLflow tracking store" in failed.stderr
    assert "MLFLOW_TRACKING_URI" in failed.stderr and "Traceback" not in failed.stderr
    with get_engine(db_url).connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM eval_runs")).scalar_one() == 0


def test_a_failing_mlflow_sink_fails_the_run_and_resume_logs_it(
    db_url: str, env_site: Path, tmp_path: Path
) -> None:
    """A store that cannot take the run fails it: exit 1, status failed, the sink named;
    --resume with a working store logs it without generating anything again."""
    broken = _mlflow_failing_late(db_url, env_site, tmp_path)
    with StubServer(StubConfig(reply_mode="echo_answer")) as stub:
        args = [
            "eval", "echo_env", "-m", "stub-model", "-b", stub.base_url,
            "-n", "5", "-r", "2", "-o", str(tmp_path / "out"),
        ]  # fmt: skip
        failed = run(*args, env=broken)
        assert failed.returncode == 1, failed.stderr
        assert "MLflow: could not log run" in failed.stderr and "Traceback" not in failed.stderr
        run_id = only_run_id(db_url)
        assert _mlflow_link(db_url) == ("failed", None)
        asked = stub.stats["ok"]
        assert asked == 10 == stored_count(get_engine(db_url), run_id)

        working = cli_env(db_url, env_site, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/m.db")
        resumed = run(*args, "--resume", run_id, env=working)
        assert resumed.returncode == 0, resumed.stderr
        assert stub.stats["ok"] == asked  # nothing generated again
    status, link = _mlflow_link(db_url)
    assert status == "completed" and link and f"mlflow run: {link}" in resumed.stdout


def test_vfops_eval_as_pid_1_of_its_namespace_exits_with_everything_in_mlflow(
    db_url: str, env_site: Path, tmp_path: Path
) -> None:
    """Exit means recorded, in any process tree: vfops eval runs as PID 1 of a PID
    namespace of its own (as in a container: everything it started dies with it), and
    right after it exits MLflow holds the run, finished, with its metrics, params, the
    rollouts artifact and one trace per rollout, and the registry run links it."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/m.db"
    env = cli_env(db_url, env_site, MLFLOW_TRACKING_URI=uri)
    env.pop("VFOPS_TRACE_ROLLOUTS", None)  # the defaults (the suite turns traces off)
    with StubServer(StubConfig(reply_mode="echo_answer")) as stub:
        args = ["eval", "echo_env", "-m", "stub-model", "-b", stub.base_url, "-n", "5", "-r", "2"]
        done = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "vfops", *args,
             "-o", str(tmp_path / "out")],
            capture_output=True, text=True, env=env, timeout=300, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run_id = only_run_id(db_url)
    status, link = _mlflow_link(db_url)
    assert status == "completed" and link is not None
    assert f"mlflow run: {link}" in done.stdout
    client = MlflowClient(uri)
    logged = client.get_run(link)
    assert logged.info.status == "FINISHED"
    assert logged.data.tags["vfops.run_id"] == run_id
    assert logged.data.tags["vfops.status"] == "completed"
    assert logged.data.params["rollouts_per_example"] == "2"
    assert logged.data.metrics["rollouts"] == 10
    assert logged.data.metrics["reward_mean"] == 1.0
    assert "rollouts.parquet" in [a.path for a in client.list_artifacts(link)]
    traces = client.search_traces(
        locations=[logged.info.experiment_id], run_id=link, max_results=100
    )
    on_disk = {
        orjson.loads(line)["trace_id"]
        for path in (tmp_path / "out").rglob("results.jsonl")
        for line in path.read_bytes().splitlines()
    }
    assert len(on_disk) == 10
    assert {t.info.tags["vfops.trace_id"] for t in traces} == on_disk, done.stderr


def test_a_run_killed_mid_way_is_killed_in_mlflow_and_resume_finishes_it_there(
    db_url: str, env_site: Path, tmp_path: Path
) -> None:
    """kill -9 of vfops eval mid-run: its tracker sees its input close and ends the MLflow
    run KILLED (never left RUNNING); --resume finishes that same MLflow run."""
    uri = f"sqlite:///{tmp_path}/m.db"
    env = cli_env(db_url, env_site, MLFLOW_TRACKING_URI=uri)
    # every request held for an hour: the run cannot end before it is killed
    config = StubConfig(reply_mode="echo_answer", latency_ms=3_600_000)
    with StubServer(config) as stub, (tmp_path / "stderr").open("w+") as stderr:
        args = ["eval", "echo_env", "-m", "stub-model", "-b", stub.base_url, "-n", "5",
                "-r", "2", "-o", str(tmp_path / "out")]  # fmt: skip
        process = subprocess.Popen(
            [sys.executable, "-m", "vfops", *args], env=env,
            stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
        try:
            # opened while the rollouts run, found by its tag (the registry links it at
            # the end); the probe opens the store as vfops does, so it never races the
            # eval's tracker on creating a fresh one
            mlflow_id = _wait_until(
                lambda: _mlflow_run_of(uri, only_run_id(db_url)) if _has_run(db_url) else None
            )
            assert mlflow_id is not None, _read(stderr)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=60)
        client = mlflow_client(uri)
        assert _wait_until(lambda: client.get_run(mlflow_id).info.status == "KILLED" or None), (
            client.get_run(mlflow_id).info.status
        )
        run_id = only_run_id(db_url)
        config.latency_ms = 0  # answered at once from now on
        resumed = run(*args, "--resume", run_id, env=env)
        assert resumed.returncode == 0, resumed.stderr
    status, link = _mlflow_link(db_url)
    assert status == "completed" and link == mlflow_id
    finished = client.get_run(mlflow_id)
    assert finished.info.status == "FINISHED" and finished.data.metrics["rollouts"] == 10


def _read(stream: Any) -> str:
    stream.seek(0)
    return str(stream.read())


def _has_run(db_url: str) -> bool:
    with get_engine(db_url).connect() as connection:
        return bool(connection.execute(text("SELECT count(*) FROM eval_runs")).scalar_one())


def _mlflow_run_of(uri: str, run_id: str) -> str | None:
    """The MLflow run tagged with registry run ``run_id``, once it exists."""
    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name("vfops/echo_env")
    if experiment is None:
        return None
    found = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`vfops.run_id` = '{run_id}'"
    )
    return found[0].info.run_id if found else None


def _wait_until(probe: Any, timeout_s: float = 120.0) -> Any:
    """``probe()`` once it is not None (polled; the deadline is only a safety net)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value is not None:
            return value
        time.sleep(0.05)
    return None


def test_runs_list_show_compare_export(
    db_url: str,
    env_site: Path,
    tmp_path: Path,
    s3_uri: str,
) -> None:
    env = cli_env(db_url, env_site)

    def wrong_on_odd(request: dict[str, Any]) -> dict[str, Any]:
        text_ = request["messages"][-1]["content"]
        number = int(text_.rsplit("ANSWER_HINT:", 1)[1])
        return {
            "role": "assistant",
            "content": f"<answer>{number if number % 2 == 0 else -1}</answer>",
        }

    with (
        StubServer(StubConfig(reply_mode="echo_answer")) as good,
        StubServer(StubConfig(reply_mode=wrong_on_odd)) as worse,
    ):
        for server in (good, worse):
            result = run(
                "eval",
                "echo_env",
                "-m",
                "stub-model",
                "-b",
                server.base_url,
                "-n",
                "10",
                "-r",
                "2",
                "-o",
                str(tmp_path / "out"),
                env=env,
            )
            assert result.returncode == 0, result.stderr
    with get_engine(db_url).connect() as connection:
        first, second = connection.execute(
            text("SELECT id FROM eval_runs ORDER BY started_at")
        ).scalars()
    listed = run("runs", "list", "--env", "echo_env", env=env)
    assert listed.returncode == 0 and first[:12] in listed.stdout and second[:12] in listed.stdout
    shown = run("runs", "show", first[:8], env=env)
    assert shown.returncode == 0 and "reward_mean" in shown.stdout and "example 0" in shown.stdout
    compared = run("runs", "compare", first, second, env=env)
    assert compared.returncode == 0, compared.stderr
    assert "10 shared examples" in compared.stdout
    assert "mean reward delta -0.5000" in compared.stdout
    assert "to fail 5" in compared.stdout and "to pass 0" in compared.stdout

    exported = run("runs", "export", second, "--to", str(tmp_path / "export"), env=env)
    assert exported.returncode == 0, exported.stderr
    dataset = load_from_disk(str(tmp_path / "export" / "dataset"))
    assert len(dataset) == 20 and sum(row["reward"] for row in dataset) == 10.0
    assert (tmp_path / "export" / "rollouts.parquet").exists()
    metadata = orjson.loads((tmp_path / "export" / "metadata.json").read_bytes())
    assert metadata["run_id"] == second

    s3_env = {**env, **{k: os.environ[k] for k in os.environ if k.startswith(("AWS_", "VFOPS_S3"))}}
    to_s3 = run("runs", "export", second, "--to", f"{s3_uri}/runs/{second}", env=s3_env)
    assert to_s3.returncode == 0, to_s3.stderr
    import boto3

    bucket = s3_uri[len("s3://") :].split("/", 1)[0]
    client = boto3.client("s3", endpoint_url=os.environ["VFOPS_S3_ENDPOINT_URL"])
    keys = {item["Key"] for item in client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert f"artifacts/runs/{second}/rollouts.parquet" in keys
    assert f"artifacts/runs/{second}/metadata.json" in keys


def test_no_secret_reaches_tables_logs_or_exports(
    db_url: str,
    env_site: Path,
    tmp_path: Path,
    s3_uri: str,
) -> None:
    api_key = "sk-test-vfops-known-fake-api-key-0123456789"
    secrets = [api_key, os.environ["AWS_SECRET_ACCESS_KEY"], os.environ["AWS_ACCESS_KEY_ID"]]
    env = cli_env(db_url, env_site, VFOPS_TEST_API_KEY=api_key, VFOPS_ARTIFACTS=s3_uri)
    with StubServer(StubConfig(reply_mode="echo_answer", api_key=api_key)) as stub:
        outputs = [
            run(
                "eval",
                "echo_env",
                "-m",
                "stub-model",
                "-b",
                stub.base_url,
                "-k",
                "VFOPS_TEST_API_KEY",
                "-n",
                "5",
                "-r",
                "2",
                "-o",
                str(tmp_path / "out"),
                env=env,
            )
        ]
        assert outputs[0].returncode == 0, outputs[0].stderr
        assert stub.stats["ok"] == 10
    run_id = only_run_id(db_url)
    outputs.append(run("runs", "show", run_id, env=env))
    outputs.append(run("runs", "export", run_id, "--to", str(tmp_path / "export"), env=env))
    assert all(o.returncode == 0 for o in outputs), [o.stderr for o in outputs]
    logs = "".join(o.stdout + o.stderr for o in outputs)
    with get_engine(db_url).connect() as connection:
        dump = []
        for table in (
            "environments",
            "environment_versions",
            "eval_runs",
            "rollouts",
            "judge_cache",
        ):
            dump.extend(str(row) for row in connection.execute(text(f"SELECT * FROM {table}")))
    files = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    for secret in secrets:
        assert secret not in logs
        assert not any(secret in row for row in dump)
        assert secret.encode() not in files


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    yield from database_url("postgresql", tmp_path)


@pytest.mark.parametrize("comes_back", [True, False], ids=["comes-back", "stays-down"])
def test_registry_outage_mid_eval_is_waited_out_or_fails_resumably(
    comes_back: bool, pg_url: str, env_site: Path, tmp_path: Path
) -> None:
    """PostgreSQL stops accepting connections mid-eval (a real TCP proxy in front of
    it is cut): generation pauses while the writes are retried; if the database comes
    back the run completes, if not the run fails in one line (status failed in its
    folder, exit 1) and --resume completes it to exactly N x R."""
    target = make_url(pg_url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 5432) as proxy:
        through = target.set(host="127.0.0.1", port=proxy.port)
        retry_s = "60" if comes_back else "3"
        env = cli_env(
            through.render_as_string(hide_password=False), env_site,
            VFOPS_TRACKING="0", VFOPS_REGISTRY_RETRY_S=retry_s,
        )  # fmt: skip
        get_engine(pg_url)
        with StubServer(StubConfig(reply_mode="echo_answer", latency_ms=200)) as stub:
            args = _kill_args(stub.base_url, tmp_path)
            process = subprocess.Popen(
                [sys.executable, "-m", "vfops", *args],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert process.stderr is not None
            results = _wait_until_mid_run(tmp_path, pg_url, rows_in_registry=True)
            proxy.cut()
            noticed = process.stderr.readline()  # the first thing it says: it is waiting
            assert "registry: the database does not answer" in noticed, noticed
            assert f"retrying for up to {retry_s} s" in noticed
            asked_at_outage = stub.stats["requests"]
            if comes_back:
                proxy.restore()
                rest = process.communicate(timeout=120)[1]
                assert process.returncode == 0, noticed + rest
                assert "answers again" in rest and "error" not in rest
            else:
                rest = process.communicate(timeout=120)[1]
                assert process.returncode == 1, noticed + rest
                assert "Traceback" not in rest
                error_lines = [line for line in rest.splitlines() if line.startswith("error:")]
                assert len(error_lines) == 1 and rest.strip().splitlines()[-1] == error_lines[0]
                assert error_lines[0].startswith(
                    f"error: registry: the database did not answer for {retry_s} s"
                )
                assert "--resume" in error_lines[0]
                metadata = orjson.loads((results.parent / "metadata.json").read_bytes())
                assert metadata["status"] == "failed"
                on_disk = len(results.read_bytes().splitlines())
                assert on_disk < 300
                # generation paused: after the outage was noticed only the groups already
                # scheduled ran (2 x ceil(c / r) groups of r rollouts: 32)
                assert stub.stats["requests"] - asked_at_outage <= 32
                proxy.restore()
                asked = stub.stats["requests"]
                resumed = run(*args, "--resume", only_run_id(pg_url), env=env)
                assert resumed.returncode == 0, resumed.stderr
                assert stub.stats["requests"] - asked == 300 - on_disk
    assert len(results.read_bytes().splitlines()) == 300
    _assert_exactly_once(pg_url, only_run_id(pg_url))


def test_two_evals_started_together_on_a_fresh_home_create_the_mlflow_store_once(
    db_url: str, env_site: Path, tmp_path: Path
) -> None:
    """Two ``vfops eval`` on a new home at the same instant: the embedded MLflow store is
    created once (the second waits for the first), both exit 0 with nothing on stderr,
    and both runs are in MLflow, linked, when they exit."""
    from mlflow import MlflowClient

    home = tmp_path / "home"
    env = cli_env(db_url, env_site, VFOPS_HOME=str(home))
    env.pop("MLFLOW_TRACKING_URI", None)  # the embedded store under the new home
    get_engine(db_url)  # the registry's schema exists (its own creation is not the point)
    with StubServer(StubConfig(reply_mode="echo_answer")) as stub:
        args = [sys.executable, "-m", "vfops", "eval", "echo_env", "-m", "stub-model", "-b",
                stub.base_url, "-n", "3", "-r", "2", "-q"]  # fmt: skip
        processes = [
            subprocess.Popen(
                [*args, "-o", str(tmp_path / f"out{i}")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(2)
        ]
        outputs = [process.communicate(timeout=300) for process in processes]
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr
        assert stderr == "", stderr
    with get_engine(db_url).connect() as connection:
        links = connection.execute(text("SELECT mlflow_run_id FROM eval_runs")).scalars().all()
    assert len(links) == 2 and all(links), links
    client = MlflowClient(f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    assert {client.get_run(link).info.status for link in links} == {"FINISHED"}


def test_the_mlflow_run_grows_while_the_rollouts_run(env_site: Path, tmp_path: Path) -> None:
    """Progress reaches MLflow during the run (a curve per statistic, step = rollouts done),
    the last point being the final figure."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/m.db"
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    env = cli_env(db_url, env_site, MLFLOW_TRACKING_URI=uri)
    env.pop("VFOPS_TRACE_ROLLOUTS", None)
    # 60 rollouts two at a time, 100 ms each: about 3 s of rollouts, a point a second
    with StubServer(StubConfig(reply_mode="echo_answer", latency_ms=100)) as stub:
        done = run("eval", "echo_env", "-m", "stub-model", "-b", stub.base_url, "-n", "30",
                   "-r", "2", "-c", "2", "-o", str(tmp_path / "out"), env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    _, link = _mlflow_link(db_url)
    assert link is not None
    history = MlflowClient(uri).get_metric_history(link, "rollouts")
    steps = [(m.step, m.value) for m in sorted(history, key=lambda m: (m.step, m.timestamp))]
    assert len(steps) >= 2, steps  # at least one point before the end
    assert all(step == value for step, value in steps), steps
    assert steps[-1] == (60, 60.0) and steps[0][0] < 60
