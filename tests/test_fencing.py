"""A run's holder is fenced by its lease, and a registry outage ends in one line (#44).

* A holder paused (SIGSTOP) past its lease, its run resumed elsewhere from a copy of its
  folder to completion, then thawed: it writes nothing more (no row, no status, no end
  of the MLflow run) and exits 4 naming the process that took the run over; the run
  stays ``completed`` / ``FINISHED`` with every row once.
* PostgreSQL unreachable longer than ``VFOPS_REGISTRY_RETRY_S`` (a real TCP proxy in
  front of it, cut): exit 1, one line naming the registry (password masked) and
  ``--resume RUN_ID``, never a driver's message; the run shows as ``stale``; the resume
  is exact.

Real subprocesses, a real stub endpoint on loopback, SQLite and PostgreSQL, a real
MLflow store.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from sqlalchemy import Engine, make_url

from tests.registry_fixtures import DIALECTS, database_url, make_record, stored_count
from tests.tcp_proxy import TcpProxy
from tests.test_tracked_eval import (
    _assert_exactly_once,
    _kill_args,
    _mlflow_run_of,
    _wait_until,
    _wait_until_mid_run,
    cli_env,
    only_run_id,
    run,
)
from vfops.registry import (
    STALE,
    LeaseLostError,
    LeaseOwner,
    NewRun,
    RunBusyError,
    create_run,
    finish_run,
    get_engine,
    get_run,
    hold_run_lease,
    release_run_lease,
    session_scope,
    shown_status,
    take_run_lease,
)
from vfops.testing import StubConfig, StubServer
from vfops.tracking import mlflow_client

pytestmark = pytest.mark.tracking  # the MLflow run's end is part of what is checked

TTL_S = "2"
"""The lease of the evaluations here (VFOPS_LEASE_TTL_S): renewed every 0.5 s."""


@pytest.fixture(params=DIALECTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path)


@pytest.fixture
def engine(db_url: str) -> Engine:
    return get_engine(db_url)


# --- the registry's fence ------------------------------------------------------------


def _new_run(engine: Engine, owner: LeaseOwner | None) -> str:
    with session_scope(engine) as session:
        new = NewRun(
            environment_name="echo_env",
            environment_version="1.0.0",
            environment_content_hash="c" * 64,
            model="m",
            num_examples=2,
            rollouts_per_example=1,
            config_fingerprint="fp",
            lease_owner=owner,
        )
        return create_run(session, new).id


def _status(engine: Engine, run_id: str) -> str:
    with session_scope(engine, write=False) as session:
        row = get_run(session, run_id)
        assert row is not None
        return row.status


def test_a_holder_whose_lease_was_taken_over_writes_nothing(engine: Engine) -> None:
    """Rows and the run's end, written with a lease another process took over, are
    refused (LeaseLostError naming the new holder) and leave nothing behind; the new
    holder's are stored; once it ended the run, the old one learns that too."""
    from vfops.registry import OPERATIONS

    _insert_rollouts = OPERATIONS["run.insert"]

    first, second = LeaseOwner.this_process(), LeaseOwner.this_process()
    run_id = _new_run(engine, first)
    with session_scope(engine) as session:
        take_run_lease(session, run_id, first, ttl_s=-1)  # lapsed (paused, cut off)
    with session_scope(engine) as session:
        take_run_lease(session, run_id, second)
    taken = rf"run {run_id} was taken over by pid {os.getpid()} on host \S+, which works on it"
    with pytest.raises(LeaseLostError, match=taken):
        _insert_rollouts(engine, run_id, [make_record(0, 0)], first)
    assert stored_count(engine, run_id) == 0  # the insert was rolled back with the fence
    with pytest.raises(LeaseLostError, match=taken), session_scope(engine) as session:
        finish_run(session, run_id, "failed", {"error": "lost"}, lease=first)
    assert _status(engine, run_id) == "running"

    assert _insert_rollouts(engine, run_id, [make_record(0, 0)], second) == 1
    with session_scope(engine) as session:
        finish_run(session, run_id, "completed", {}, lease=second)
        release_run_lease(session, run_id, second)
    ended = rf"run {run_id} was taken over by pid {os.getpid()} .*, which ended it \(completed\)"
    with pytest.raises(LeaseLostError, match=ended), session_scope(engine) as session:
        finish_run(session, run_id, "failed", {}, lease=first)
    with pytest.raises(LeaseLostError), session_scope(engine) as session:
        hold_run_lease(session, run_id, second)  # released: no one's any more
    assert _status(engine, run_id) == "completed" and stored_count(engine, run_id) == 1
    assert issubclass(LeaseLostError, RunBusyError) and LeaseLostError.exit_code == 4


def test_a_running_run_nobody_holds_is_shown_stale(engine: Engine) -> None:
    """Computed when read: a run still ``running`` whose lease expired, was released,
    or whose holder is a dead process of this host is ``stale``; a held one is not."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    alive, remote = LeaseOwner.this_process(), LeaseOwner("elsewhere.example", 1, "r")
    dead = LeaseOwner(alive.host, int(gone.stdout), "dead")
    cases = {
        "held": (alive, 60, "running"),
        "expired": (remote, -1, STALE),
        "dead holder": (dead, 3600, STALE),
        "remote holder": (remote, 3600, "running"),  # cannot be checked: its lease decides
    }
    for name, (owner, ttl_s, shown) in cases.items():
        run_id = _new_run(engine, None)
        with session_scope(engine) as session:
            take_run_lease(session, run_id, owner, ttl_s=ttl_s)
        with session_scope(engine, write=False) as session:
            row = get_run(session, run_id)
            assert row is not None and shown_status(row) == shown, name
    released = _new_run(engine, alive)
    with session_scope(engine) as session:
        release_run_lease(session, released, alive)
        row = get_run(session, released)
        assert row is not None and shown_status(row) == STALE
        finish_run(session, released, "failed", {})
        assert shown_status(row) == "failed"


@pytest.fixture
def pg_engine(tmp_path: Path) -> Iterator[Engine]:
    for url in database_url("postgresql", tmp_path):
        yield get_engine(url)


def test_a_takeover_does_not_hang_on_a_holder_paused_mid_write(pg_engine: Engine) -> None:
    """A holder stopped between its fenced write and its commit keeps the run's row
    locked: a taker is refused as busy within seconds instead of waiting for it."""
    holder, taker = LeaseOwner.this_process(), LeaseOwner.this_process()
    run_id = _new_run(pg_engine, holder)
    with session_scope(pg_engine) as session:
        take_run_lease(session, run_id, holder, ttl_s=-1)
    with session_scope(pg_engine) as paused:
        hold_run_lease(paused, run_id, holder, ttl_s=-1)  # its write, not committed yet
        started = time.monotonic()
        busy = r"being written by its holder, pid \d+ on host \S+, right now"
        with pytest.raises(RunBusyError, match=busy), session_scope(pg_engine) as session:
            take_run_lease(session, run_id, taker)
        assert time.monotonic() - started < 30
    with session_scope(pg_engine) as session:  # committed: now it can be taken over
        take_run_lease(session, run_id, taker)


# --- a paused holder comes back --------------------------------------------------------


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def _pause(process: subprocess.Popen[str]) -> None:
    """SIGSTOP the evaluating process, and wait until it is stopped: its lease is no
    longer renewed. (Its tracker, which serves its registry calls, runs on and ends the
    call in flight; a stopped tracker could hold the embedded MLflow store's lock, which
    the resumer's tracker would wait for: not what is tested here.)"""
    process.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 60  # a safety net: it returns on the state
    while not _stopped(process.pid):
        assert time.monotonic() < deadline, "the evaluation did not stop"
        time.sleep(0.01)


def _lease(db_url: str) -> tuple[str | None, dt.datetime | None]:
    engine = get_engine(db_url)
    with session_scope(engine, write=False) as session:
        row = get_run(session, only_run_id(db_url))
        assert row is not None
        owner, expires = row.lease_owner, row.lease_expires
    if expires is not None and expires.tzinfo is None:  # SQLite's are naive (UTC)
        expires = expires.replace(tzinfo=dt.UTC)
    return owner, expires


def _lease_lapsed(db_url: str) -> bool | None:
    expires = _lease(db_url)[1]
    return True if expires is not None and expires < dt.datetime.now(dt.UTC) else None


def _mlflow_run(uri: str, run_id: str) -> tuple[str, float | None]:
    """The MLflow run's status and its ``rollouts`` metric (None before the tracker's
    first metrics batch: a run cut early may be ended before any was logged)."""
    found = _mlflow_run_of(uri, run_id)
    assert found is not None
    run_ = mlflow_client(uri).get_run(found)
    return run_.info.status, run_.data.metrics.get("rollouts")


def test_a_holder_paused_past_its_lease_comes_back_to_a_run_finished_elsewhere(
    db_url: str, env_site: Path, tmp_path: Path
) -> None:
    """The lost worker of a distributed sweep coming back: its run was resumed on
    another machine from a copy of its folder and completed; it exits 4 naming that
    process, and the run stays completed and FINISHED with every rollout once."""
    uri = f"sqlite:///{tmp_path}/m.db"
    env = cli_env(db_url, env_site, MLFLOW_TRACKING_URI=uri, VFOPS_LEASE_TTL_S=TTL_S)
    get_engine(db_url)
    config = StubConfig(reply_mode="echo_answer", latency_ms=200)
    with StubServer(config) as stub:
        args = _kill_args(stub.base_url, tmp_path / "a")
        holder = subprocess.Popen(
            [sys.executable, "-m", "vfops", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            results = _wait_until_mid_run(tmp_path / "a", db_url, rows_in_registry=True)
            run_id = only_run_id(db_url)
            _pause(holder)
            assert _wait_until(lambda: _lease_lapsed(db_url), 60), "the lease never lapsed"
            # its own folder is still locked by the paused process: refused before the
            # lease is touched (it could only be refused after taking the run from it)
            lease = _lease(db_url)
            same = run(*args, "--resume", str(results.parent), env=env)
            assert same.returncode == 4, same.stderr
            assert f"is being worked on by pid {holder.pid} on host" in same.stderr
            assert _lease(db_url) == lease
            # a copy of its folder (another machine's disk) is resumed to completion
            copy = tmp_path / "b" / results.parent.name
            shutil.copytree(results.parent, copy)
            config.latency_ms = 0  # answered at once from now on
            resumer = subprocess.Popen(
                [sys.executable, "-m", "vfops", *args, "--resume", str(copy)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            _, resumer_err = resumer.communicate(timeout=300)
            assert resumer.returncode == 0, resumer_err
            _assert_exactly_once(db_url, run_id)
            assert _mlflow_run(uri, run_id) == ("FINISHED", 300)
        finally:
            holder.send_signal(signal.SIGCONT)
        _, holder_err = holder.communicate(timeout=300)
    assert holder.returncode == 4, holder_err
    assert "Traceback" not in holder_err
    (line,) = [line for line in holder_err.splitlines() if line.startswith("error:")]
    assert holder_err.strip().splitlines()[-1] == line
    assert (
        line.startswith(f"error: run {run_id} was taken over by pid {resumer.pid} on host ")
        and "which ended it (completed)" in line
    ), line
    # nothing more from it: not a row, not a status, not the MLflow run's end
    _assert_exactly_once(db_url, run_id)
    assert _mlflow_run(uri, run_id) == ("FINISHED", 300)
    assert _lease(db_url)[1] is None  # released by the resumer, not taken back
    metadata = orjson.loads((results.parent / "metadata.json").read_bytes())
    assert metadata["status"] == "running"  # its own folder says nothing it did not do


# --- a registry outage ---------------------------------------------------------------


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    yield from database_url("postgresql", tmp_path)


def test_a_registry_outage_past_the_retry_window_names_the_registry_and_resume(
    pg_url: str, env_site: Path, tmp_path: Path
) -> None:
    """PostgreSQL stops answering mid-run for longer than VFOPS_REGISTRY_RETRY_S (the
    proxy in front of it is cut), with tracking on: exit 1, one line naming the registry
    (its password masked) and ``--resume RUN_ID``, no driver message; the run, left
    ``running`` in the registry by a process that is gone, shows as stale; once the
    database is back the resume completes it exactly, in MLflow too."""
    uri = f"sqlite:///{tmp_path}/m.db"
    target = make_url(pg_url)
    password = "pw-not-to-be-printed"
    with TcpProxy(target.host or "127.0.0.1", target.port or 5432) as proxy:
        through = target.set(host="127.0.0.1", port=proxy.port, password=password)
        env = cli_env(
            through.render_as_string(hide_password=False), env_site,
            MLFLOW_TRACKING_URI=uri, VFOPS_REGISTRY_RETRY_S="2", VFOPS_LEASE_TTL_S=TTL_S,
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
            results = _wait_until_mid_run(tmp_path, pg_url, rows_in_registry=True)
            run_id = only_run_id(pg_url)
            proxy.cut()
            _, err = process.communicate(timeout=120)
            assert process.returncode == 1, err
            errors = [line for line in err.splitlines() if line.startswith("error:")]
            assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err
            masked = through.render_as_string(hide_password=True)
            assert masked in errors[0] and ":***@" in masked, errors[0]
            assert f"vfops eval ... --resume {run_id}" in errors[0]
            for never in (password, "Traceback", "OperationalError", "connection failed:"):
                assert never not in err, never
            # MLflow was not told an end the registry could not record: its tracker ended
            # the run as killed (input closed), and the resume finishes it
            assert _mlflow_run(uri, run_id)[0] == "KILLED"
            proxy.restore()
            on_disk = len(results.read_bytes().splitlines())
            listed = run("runs", "list", env=env)
            (row,) = [line for line in listed.stdout.splitlines() if run_id[:12] in line]
            assert f" {STALE} " in row, listed.stdout
            shown = run("runs", "show", run_id, env=env)
            assert f"{STALE} (still running in the registry" in shown.stdout, shown.stdout
            asked = stub.stats["requests"]
            resumed = run(*args, "--resume", run_id, env=env)
            assert resumed.returncode == 0, resumed.stderr
            assert stub.stats["requests"] - asked == 300 - on_disk
    _assert_exactly_once(pg_url, run_id)
    assert _mlflow_run(uri, run_id) == ("FINISHED", 300)
