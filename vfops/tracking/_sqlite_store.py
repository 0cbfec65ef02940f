"""An SQLite MLflow store that is whole or absent, never half-created.

MLflow creates a fresh store's schema in place, in some seventy steps over a few
seconds, each committed on its own: a process killed meanwhile leaves tables partly
there, and every later open fails (``table latest_metrics already exists``) — for
good. So vfops creates the schema in a temporary file beside the store, under the
store's lock (:func:`vfops.tracking._client._creating_store`), and renames it into
place: a kill leaves either no store or a whole one. A store left half-created by
anything else (an older vfops, MLflow itself) holds nothing yet: it is moved aside and
created again. One that holds runs but is not at this MLflow's schema is refused, in
one line naming the real fix, before a run starts (:func:`check_store_file`, which the
evaluating process runs without importing MLflow).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from vfops._errors import VfopsError

_SIDE_FILES: Final = ("-journal", "-wal", "-shm")
_REVISION = re.compile(r"^(down_)?revision\s*(?::[^=]*)?=\s*(.+)$", re.MULTILINE)
_QUOTED = re.compile(r"""["']([0-9A-Za-z_]+)["']""")


class TrackingStoreError(VfopsError):
    """The MLflow store exists but cannot be used as it is; the message says what to do
    (not "fix MLFLOW_TRACKING_URI": the store, not the setting, is what is wrong)."""


@dataclass(frozen=True)
class StoreState:
    """What an SQLite MLflow store file holds, read with ``sqlite3`` alone."""

    exists: bool
    version: str | None = None
    """The schema revision recorded by MLflow's migrations (None: none finished)."""
    holds_data: bool = False
    """Runs, registered models or experiments of its own (beyond MLflow's default)."""


def inspect_store(path: Path, *, read_only: bool = True) -> StoreState:
    """The state of the store file ``path`` (``read_only=False`` also rolls back a
    transaction a killed writer left, as any writer opening it would)."""
    if not path.exists() or path.stat().st_size == 0:
        return StoreState(exists=path.exists())
    uri = f"{path.resolve().as_uri()}?mode={'ro' if read_only else 'rw'}"
    connection = sqlite3.connect(uri, uri=True, timeout=30)
    try:
        tables = {row[0] for row in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"
        )}  # fmt: skip
        version = None
        if "alembic_version" in tables:
            found = connection.execute("SELECT version_num FROM alembic_version").fetchone()
            version = str(found[0]) if found else None
        held = 0
        for table, where in (
            ("runs", ""),
            ("registered_models", ""),
            ("experiments", " WHERE experiment_id != 0"),
        ):
            if table in tables:
                held += connection.execute(f"SELECT count(*) FROM {table}{where}").fetchone()[0]
        return StoreState(exists=True, version=version, holds_data=held > 0)
    finally:
        connection.close()


def schema_head() -> str | None:
    """The schema revision this MLflow creates, read from its migration scripts without
    importing MLflow (None when they cannot be found: nothing is judged then)."""
    import importlib.util

    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec("mlflow")
        if spec is None or spec.origin is None:
            return None
        folder = Path(spec.origin).parent / "store" / "db_migrations" / "versions"
        revisions: set[str] = set()
        replaced: set[str] = set()
        for script in folder.glob("*.py"):
            for down, value in _REVISION.findall(script.read_text(encoding="utf-8")):
                (replaced if down else revisions).update(_QUOTED.findall(value))
        heads = revisions - replaced
        return heads.pop() if len(heads) == 1 else None
    return None


def _refusal(path: Path, state: StoreState, head: str) -> TrackingStoreError:
    found = f"schema {state.version}" if state.version else "a half-created schema"
    return TrackingStoreError(
        f"the MLflow store {path} has {found}, not {head} (this MLflow's), and holds runs: "
        f"back it up, then run `mlflow db upgrade sqlite:///{path}` (or restore the backup, "
        "or move the file aside to start a new store there)"
    )


def check_store_file(path: Path) -> None:
    """Refuse, before a run starts, an existing store that the tracker could neither
    open nor rebuild (it holds runs but is not at this MLflow's schema); a missing or
    half-created empty one passes (the tracker creates it whole). Cheap: ``sqlite3``
    and the migration scripts' text, no MLflow."""
    head = schema_head()
    if head is None:
        return
    try:
        state = inspect_store(path)
    except sqlite3.Error:
        return  # e.g. a killed writer's transaction to roll back: the tracker opens it
    if state.exists and state.version != head and state.holds_data:
        raise _refusal(path, state, head)


def prepare_store(path: Path) -> None:
    """Make the store at ``path`` whole before MLflow opens it (the caller holds the
    store's lock): created in a temporary file and renamed into place when missing;
    moved aside and created again when half-created and empty; refused in one line
    when it holds runs at another schema."""
    from vfops._atomic import remove_stale

    remove_stale(path)  # temporary stores of creators killed midway
    head = schema_head()
    state = inspect_store(path, read_only=False)
    if state.exists and (head is None or state.version == head):
        return
    if state.exists and state.holds_data:
        assert head is not None
        raise _refusal(path, state, head)
    if state.exists:
        aside = _move_aside(path)
        print(
            f"vfops: the MLflow store {path} was half-created (a process was killed while "
            f"creating it; it held no runs): moved to {aside.name}, created again",
            file=sys.stderr,
        )
    _create(path)


def _move_aside(path: Path) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%f")
    aside = path.with_name(f"{path.name}.broken-{stamp}")
    os.replace(path, aside)
    for suffix in _SIDE_FILES:
        side = path.with_name(path.name + suffix)
        if side.exists():
            os.replace(side, aside.with_name(aside.name + suffix))
    return aside


def _create(path: Path) -> None:
    """The schema in a temporary file beside ``path``, then renamed into place (synced)."""
    from mlflow.store.db.utils import _initialize_tables

    from vfops._atomic import publish, temp_beside
    from vfops.registry import unsynced_sqlite_engine

    temp = temp_beside(path)
    try:
        # MLflow's migrations commit some 120 times; on the store's own file each commit
        # syncs the disk twice (its journal, then the file): ~6 s of a fresh home's first
        # eval on a busy disk. The temporary file has no reader and is synced once,
        # whole, by publish() before it gets the store's name, so its commits need no
        # sync (the published store is opened with SQLite's defaults).
        with unsynced_sqlite_engine(temp) as engine:
            _initialize_tables(engine)  # type: ignore[no-untyped-call]
        for suffix in _SIDE_FILES:  # none after a clean close; never carried along
            with contextlib.suppress(FileNotFoundError):
                temp.with_name(temp.name + suffix).unlink()
        publish(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
