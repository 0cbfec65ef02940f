"""Promotion is a compare-and-set on the alias's holder (issue 44, item 5).

Two ``vfops promote`` processes gate two candidates against the champion v1 at once,
then meet at the move (the ``VFOPS_TEST_PROMOTION_BARRIER`` hook: each waits there
until both have evaluated their gate). One moves the alias; the other finds the holder
changed under the alias's lock, writes nothing, gates again against the new holder and
records that decision. The history's moves form one chain: each names the holder it
replaced, and no holder is replaced twice. Real stores: the embedded MLflow store
(SQLite) and the registry on SQLite and PostgreSQL.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.model_fixtures import checkpoint
from tests.registry_fixtures import DIALECTS, database_url

pytestmark = pytest.mark.filterwarnings(  # MLflow's SQLAlchemy store on SQLAlchemy 2.1
    "ignore:The ``noload`` loader strategy is deprecated:DeprecationWarning"
)

GATE = ["-n", "6", "-r", "1", "-T", "0"]


@pytest.fixture(params=DIALECTS)
def stores(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The embedded MLflow store in a fresh home, the registry on ``request.param``;
    gate evals untracked (the MLflow registry is what the alias lives in)."""
    monkeypatch.setenv("VFOPS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("VFOPS_TRACKING", "0")
    monkeypatch.setenv("USER", "tester")
    for url in database_url(request.param, tmp_path):
        monkeypatch.setenv("VFOPS_DATABASE_URL", url)
        yield url


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _promote(version: str, gate_env: str, barrier: Path) -> subprocess.Popen[str]:
    spec = importlib.util.find_spec("brevity_gate_env")  # the gate env's site folder
    assert spec is not None and spec.origin is not None
    site = str(Path(spec.origin).parent)
    path = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "VFOPS_TEST_PROMOTION_BARRIER": str(barrier)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vfops",
            "promote",
            "race",
            version,
            "-e",
            gate_env,
            *GATE,
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _decision(stdout: str) -> dict[str, Any]:
    decision: dict[str, Any] = json.loads(stdout[stdout.index("{\n") :])
    return decision


def test_two_promotions_at_once_move_the_alias_once_from_each_holder(
    tiny_base: Path, gate_env: str, stores: str, tmp_path: Path
) -> None:
    from vfops.models import PromotionRequest, promote, promotion_history, register_checkpoint
    from vfops.tracking import mlflow_client

    for version, tokens in (("1", 16), ("2", 8), ("3", 4)):  # shorter is better
        info = register_checkpoint(
            checkpoint(tiny_base, tmp_path / f"v{version}", tokens), name="race"
        )
        assert info.version == version
    sampling = {"temperature": 0.0}
    first = promote(
        PromotionRequest("race", "1", [gate_env], num_examples=6, sampling_args=sampling)
    )
    assert first.promoted

    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = {version: _promote(version, gate_env, barrier) for version in ("2", "3")}
    try:
        # both evaluated their candidate and compared it with v1; both wait at the move
        _wait_for(
            lambda: (
                len(list(barrier.glob("ready-*"))) == 2
                or any(p.poll() is not None for p in procs.values())
            ),
            "both promotions to reach the move",
        )
        assert all(p.poll() is None for p in procs.values()), "a promotion ended early"
        (barrier / "go").touch()
        done = {version: p.communicate(timeout=300) for version, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()

    history = promotion_history("race")
    assert [e.outcome for e in history[:2]] == ["promoted", "promoted"], history
    winner = history[1].to_version
    loser = "3" if winner == "2" else "2"
    assert history[1].from_version == "1" and history[1].evidence["replaced_during_gate"] == []
    # the winner printed its move from v1
    assert procs[winner].returncode == 0, done[winner][1]
    assert _decision(done[winner][0])["from_version"] == "1"

    # the loser wrote nothing against v1: it gated again against the winner and recorded that
    assert len(history) == 3, [(e.from_version, e.to_version, e.outcome) for e in history]
    last = history[2]
    assert (last.from_version, last.to_version) == (winner, loser)
    assert last.evidence["replaced_during_gate"] == ["1"]
    assert f"the holder changed while the gate ran (v1 -> v{winner})" in last.reason
    decision = _decision(done[loser][0])
    assert decision["from_version"] == winner and decision["outcome"] == last.outcome
    assert procs[loser].returncode == (0 if last.outcome == "promoted" else 1), done[loser][1]
    # its comparison is with the winner's own gate run (reused), not with v1's
    (env_result,) = decision["envs"]
    assert env_result["holder_run_id"] == history[1].evidence["envs"][gate_env]["candidate_run_id"]
    assert env_result["holder_reused"]

    # one chain of holders: each move replaces the holder the one before left, once
    moves = [e for e in history if e.outcome == "promoted"]
    assert [m.from_version for m in moves] == [None, *(m.to_version for m in moves[:-1])]
    assert len({m.from_version for m in moves}) == len(moves)
    champion = mlflow_client().get_model_version_by_alias("race", "champion")
    assert str(champion.version) == moves[-1].to_version


def test_a_holder_set_outside_vfops_is_recorded_before_the_next_decision(
    tiny_base: Path, gate_env: str, stores: str, tmp_path: Path
) -> None:
    """The MLflow alias is the truth; the history records the move it did not see, so
    the next decision's ``from_version`` follows on from the history's last holder."""
    from vfops.models import PromotionRequest, promote, promotion_history, register_checkpoint
    from vfops.tracking import mlflow_client

    for tokens in (16, 4):
        register_checkpoint(checkpoint(tiny_base, tmp_path / f"t{tokens}", tokens), name="ext")
    gate = {"gate_envs": [gate_env], "num_examples": 4, "sampling_args": {"temperature": 0.0}}
    assert promote(PromotionRequest("ext", "1", **gate)).promoted
    mlflow_client().set_registered_model_alias("ext", "champion", "2")  # by hand

    refused = promote(PromotionRequest("ext", "1", **gate))
    assert refused.outcome == "refused" and refused.from_version == "2"
    assert [(e.from_version, e.to_version, e.outcome) for e in promotion_history("ext")] == [
        (None, "1", "promoted"),
        ("1", "2", "external"),
        ("2", "1", "refused"),
    ]
    external = promotion_history("ext")[1]
    assert "moved outside vfops promote" in external.reason and external.actor == "unknown"


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    yield from database_url("postgresql", tmp_path)


def test_the_alias_lock_blocks_moves_of_that_alias_only(pg_url: str) -> None:
    """PostgreSQL: a second promotion of the same alias waits for the first one's
    transaction (seen waiting in pg_locks); another alias does not wait."""
    import threading

    from sqlalchemy import text

    from vfops.registry import get_engine, lock_alias, session_scope
    from vfops.registry._alias_events import _alias_lock_key

    engine = get_engine(pg_url)
    acquired = threading.Event()

    def second() -> None:
        with session_scope(engine) as session:
            lock_alias(session, "m", "champion")
            acquired.set()

    key = _alias_lock_key("m", "champion") & 0xFFFFFFFFFFFFFFFF  # as pg_locks shows it
    query = text(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND classid::bigint = :high AND objid::bigint = :low AND objsubid = 1"
    )

    def waiting() -> bool:
        with engine.connect() as connection:
            found = connection.execute(query, {"high": key >> 32, "low": key & 0xFFFFFFFF})
            return bool(found.scalar())

    with session_scope(engine) as first:
        lock_alias(first, "m", "champion")
        thread = threading.Thread(target=second)
        thread.start()
        _wait_for(waiting, "the second promotion to wait for the lock", timeout=30)
        assert not acquired.is_set()
        with session_scope(engine) as other:  # another alias: no wait
            lock_alias(other, "m", "staging")
    thread.join(timeout=30)
    assert acquired.is_set()


def test_the_alias_lock_needs_a_write_session(tmp_path: Path) -> None:
    """SQLite: the lock is the write lock a write session takes at BEGIN IMMEDIATE; a
    read session (BEGIN DEFERRED) would lock nothing, so it is refused."""
    from vfops.registry import get_engine, lock_alias, session_scope

    for url in database_url("sqlite", tmp_path):
        engine = get_engine(url)
        with session_scope(engine) as session:
            lock_alias(session, "m", "champion")
        with (
            pytest.raises(RuntimeError, match="needs a write session"),
            session_scope(engine, write=False) as session,
        ):
            lock_alias(session, "m", "champion")
