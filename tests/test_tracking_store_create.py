"""A fresh MLflow store is created without a disk sync per migration step (its
temporary file has no reader; it is synced once, whole, when published), and is the
same store MLflow's own creation makes."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from vfops.tracking import _sqlite_store


def _clauses(sql: str | None) -> tuple[str, ...]:
    # a table's constraints come in no fixed order (MLflow's batch migrations rebuild
    # tables from sets): two creations by MLflow itself differ there
    lines = (line.strip().rstrip(",").strip() for line in (sql or "").splitlines())
    return tuple(sorted(line for line in lines if line))


def _contents(path: Path) -> tuple[list[tuple[Any, ...]], dict[str, list[tuple[Any, ...]]], str]:
    connection = sqlite3.connect(path)
    try:
        schema = sorted(
            (kind, name, table, _clauses(sql))
            for kind, name, table, sql in connection.execute(
                "SELECT type, name, tbl_name, sql FROM sqlite_master"
            )
        )
        rows = {
            name: sorted(connection.execute(f'SELECT * FROM "{name}"'), key=str)
            for kind, name, _, _ in schema
            if kind == "table"
        }
        (journal,) = connection.execute("PRAGMA journal_mode").fetchone()
        return schema, rows, str(journal)
    finally:
        connection.close()


def test_a_fresh_store_is_created_unsynced_and_is_mlflows_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.store.db import utils

    initialize = utils._initialize_tables
    seen: dict[str, Any] = {}

    def spying(engine: sqlalchemy.Engine) -> None:
        with engine.connect() as connection:  # a connection as the migrations get them
            seen["synchronous"] = connection.exec_driver_sql("PRAGMA synchronous").scalar()
            seen["journal"] = connection.exec_driver_sql("PRAGMA journal_mode").scalar()
        initialize(engine)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(utils, "_initialize_tables", spying)
    ours = tmp_path / "ours" / "mlflow.db"
    ours.parent.mkdir()
    _sqlite_store.prepare_store(ours)
    assert seen == {"synchronous": 0, "journal": "memory"}  # OFF, while it is private

    monkeypatch.setattr(utils, "_initialize_tables", initialize)
    theirs = tmp_path / "theirs.db"
    engine = sqlalchemy.create_engine(f"sqlite:///{theirs}", poolclass=sqlalchemy.pool.NullPool)
    try:
        initialize(engine)  # type: ignore[no-untyped-call]
    finally:
        engine.dispose()
    # the same tables, indexes and rows; the published file in SQLite's default mode
    assert _contents(ours) == _contents(theirs)
    assert _contents(ours)[2] == "delete"
    assert sorted(p.name for p in ours.parent.iterdir()) == ["mlflow.db"]


def test_a_stopped_opener_of_the_store_is_named_not_waited_for_forever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process holding the store's opening lock (as one stopped mid-open would) makes
    the next opener give up after VFOPS_MLFLOW_STORE_WAIT_S with exit 4 naming its pid;
    once it lets go, the store opens."""
    import subprocess
    import sys

    from vfops.tracking import _client

    store = tmp_path / "mlflow.db"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys\n"
         f"fd = os.open({str(store)!r} + '.lock', os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\n"
         "os.pwrite(fd, f'{os.getpid()}\\n'.encode(), 0)\n"
         "print('held', flush=True)\n"
         "sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("VFOPS_MLFLOW_STORE_WAIT_S", "0.3")
        with pytest.raises(_client.TrackingStoreBusyError) as caught:
            _client.mlflow_client(f"sqlite:///{store}")
        message = str(caught.value)
        assert f"process {holder.pid} has been opening the MLflow store" in message
        assert "\n" not in message and caught.value.exit_code == 4
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
        if holder.stdout is not None:
            holder.stdout.close()
    client = _client.mlflow_client(f"sqlite:///{store}")
    assert client.search_experiments(max_results=1)  # the Default experiment: opened
