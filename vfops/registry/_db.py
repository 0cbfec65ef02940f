"""Engines, transactions and the schema version of the registry database.

One engine per URL per process. SQLite is the embedded default (``$VFOPS_HOME``),
PostgreSQL the production store; both are migrated by the same Alembic scripts in
``vfops/registry/migrations`` (inside the package so a wheel install carries them).

A new, empty database is migrated to head on first use, so no set-up step exists;
a database at an older revision is refused until ``vfops db upgrade`` is run, so
an upgrade never happens behind the user's back on a shared database.

A SQLite file is checked for damage when a process first opens it
(:mod:`vfops.registry._integrity`), and SQLite's errors about a damaged or unwritable
file are one-line VfopsErrors wherever a query meets them.
"""

from __future__ import annotations

import atexit
import functools
import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import orjson
from sqlalchemy import Connection, Engine, create_engine, event, inspect, make_url, text
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.pool import ConnectionPoolEntry

from vfops._errors import VfopsError
from vfops._paths import check_writable_folder
from vfops._rollout import dumps_escaped
from vfops._settings import database_url
from vfops.registry._integrity import (
    check_integrity,
    forget_checked,
    is_unopenable,
    sqlite_error,
    stamp_after_write,
    unwritable_message,
)
from vfops.registry._models import Base

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

# Serialises concurrent first-use migrations of one PostgreSQL database.
_PG_MIGRATION_LOCK = zlib.crc32(b"vfops.registry.migrate")
# SQLite: how long a writer waits for another writer's lock before failing.
_SQLITE_BUSY_TIMEOUT_MS = 30_000
# Execution option naming the SQLite BEGIN mode (see _configure_sqlite).
_SQLITE_BEGIN = "vfops_sqlite_begin"

_lock = threading.RLock()
_engines: dict[str, Engine] = {}
_checked: set[str] = set()
_created_by: dict[str, int] = {}  # url -> the process that created its engine


def json_dumps(value: Any) -> str:
    """orjson for every JSON column: several times faster than ``json.dumps``; text
    UTF-8 cannot encode (a lone surrogate) is stored escaped, not refused."""
    return dumps_escaped(value).decode()


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe to print or log)."""
    return make_url(url).render_as_string(hide_password=True)


def url_backend(url: str) -> tuple[str, bool] | None:
    """``url``'s backend (``postgresql``, ``sqlite``) and whether it holds a password;
    None when it is not a database URL."""
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    return parsed.get_backend_name(), parsed.password is not None


def url_with(url: str, *, driver: str | None = None, database: str | None = None) -> str:
    """``url`` with another driver (``postgresql+psycopg``; ``postgresql`` alone for the
    backend's default) and/or database, password kept."""
    parsed = make_url(url)
    if driver is not None:
        parsed = parsed.set(drivername=driver)
    if database is not None:
        parsed = parsed.set(database=database)
    return parsed.render_as_string(hide_password=False)


@contextmanager
def unsynced_sqlite_engine(path: Path) -> Iterator[Engine]:
    """An engine on SQLite file ``path`` whose commits never sync the disk and whose
    rollback journal stays in memory, disposed on exit: for building a file nobody reads
    yet, synced once, whole, by whoever publishes it (neither setting is stored in the
    file). Not the registry's engine: it is how another store's schema (MLflow's) is
    created fast."""
    from sqlalchemy.pool import NullPool

    engine = create_engine(f"sqlite:///{path}", poolclass=NullPool)
    event.listen(engine, "connect", _unsynced)
    try:
        yield engine
    finally:
        engine.dispose()


def _unsynced(connection: sqlite3.Connection, record: object) -> None:
    cursor = connection.cursor()
    try:
        cursor.execute("PRAGMA synchronous = OFF")
        cursor.execute("PRAGMA journal_mode = MEMORY")
    finally:
        cursor.close()


def get_engine(url: str | None = None, *, check_schema: bool = True) -> Engine:
    """The process-wide engine for ``url`` (default: :func:`vfops._settings.database_url`).

    With ``check_schema`` (the default) the first call per URL runs
    :func:`ensure_schema`: an empty database is created, an outdated one refused.
    """
    url = url or database_url()
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _create_engine(url)
            _check_connects(engine, url)
            path = sqlite_path(engine)
            if path is not None:
                try:
                    check_integrity(engine, path)
                except BaseException:
                    engine.dispose()
                    raise
            _engines[url] = engine
            _created_by[url] = os.getpid()
        if check_schema and url not in _checked:
            ensure_schema(engine)
            _checked.add(url)
    return engine


def dispose_engines() -> None:
    """Close every cached engine's connections and forget them (tests, forks)."""
    with _lock:
        paths = [sqlite_path(engine) for engine in _engines.values()]
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
        _checked.clear()
        _created_by.clear()
    # closed: SQLite checkpointed the WAL into the file; stamp it as it is now
    forget_checked([path for path in paths if path is not None])


def _dispose_at_exit() -> None:
    # So that the next process finds the file as stamped: closing the last connection
    # checkpoints the WAL into it (a process that ends with os._exit leaves the WAL as
    # stamped). Never in a forked child holding its parent's engines: closing those
    # connections would checkpoint under the parent's feet.
    with _lock:
        inherited = any(pid != os.getpid() for pid in _created_by.values())
    if not inherited:
        dispose_engines()


atexit.register(_dispose_at_exit)


def sqlite_path(engine: Engine) -> str | None:
    """The absolute path of a SQLite engine's file; None for other databases."""
    if engine.dialect.name != "sqlite" or not engine.url.database:
        return None
    return os.path.abspath(engine.url.database)


def _create_engine(url: str) -> Engine:
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database
        if not database or database == ":memory:" or parsed.query.get("mode") == "memory":
            raise VfopsError(
                f"the registry needs a SQLite file, not an in-memory database ({url}); "
                "set VFOPS_DATABASE_URL to sqlite:///path/to/registry.db"
            )
        _make_folder(Path(database).parent)
        engine = create_engine(parsed, json_serializer=json_dumps, json_deserializer=orjson.loads)
        _configure_sqlite(engine)
        return engine
    if backend == "postgresql":
        if parsed.get_driver_name() != "psycopg":
            raise VfopsError(
                f"unsupported PostgreSQL driver in {mask_url(url)}; "
                "use postgresql+psycopg://user@host/db"
            )
        return create_engine(
            parsed,
            json_serializer=json_dumps,
            json_deserializer=orjson.loads,
            # a server restart or idle timeout must not break the next command
            pool_pre_ping=True,
        )
    raise VfopsError(
        f"unsupported registry database {mask_url(url)}: use sqlite:///path or "
        "postgresql+psycopg://user@host/db in VFOPS_DATABASE_URL"
    )


_DATABASE_FIX = "fix the database URL (VFOPS_DATABASE_URL; vfops db: --url)"


def _make_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fix = f"set VFOPS_HOME or {_DATABASE_FIX}"
        check_writable_folder(folder, what="registry database folder", fix=fix)
        raise VfopsError(
            f"registry database folder {folder} cannot be created ({exc.strerror}); {fix}"
        ) from None


def _check_connects(engine: Engine, url: str) -> None:
    """A database that cannot be reached (server down, no such database, a SQLite file
    that cannot be opened) fails here, in one line, before any command uses it. The
    connection goes back to the pool: the command's first query reuses it."""
    path = sqlite_path(engine)
    try:
        with engine.connect():
            pass
    except VfopsError:  # the SQLite file's own error (_on_error)
        engine.dispose()
        raise
    except DBAPIError as exc:
        engine.dispose()
        reason = " ".join(str(exc.orig).split()) or type(exc.orig).__name__
        if path is not None and exc.orig is not None:
            _sqlite_open_failed(path, exc.orig)
        error = RegistryUnreachableError if _unreachable(reason) else VfopsError
        raise error(
            f"cannot connect to the registry database {mask_url(url)} ({reason}); check that "
            f"the server runs and the database exists (create it), or {_DATABASE_FIX}"
        ) from None


class RegistryUnreachableError(VfopsError):
    """The registry's server did not answer (refused, timed out, dropped the connection):
    an outage, not bad input, so exit 1; a database that does not exist, a refused login
    or an unsupported URL stays exit 2."""

    exit_code = 1


_UNREACHABLE: Final = (
    "connection refused",
    "timeout expired",
    "timed out",
    "no route to host",
    "network is unreachable",
    "server closed the connection",
    "connection reset",
)


def _unreachable(reason: str) -> bool:
    lowered = reason.lower()
    return any(marker in lowered for marker in _UNREACHABLE)


def _sqlite_open_failed(path: str, error: BaseException) -> None:
    """Raise the one-line error of a SQLite file that cannot be opened (or created) in
    its folder: SQLite creates the file, its WAL and its -shm there. (A damaged file is
    _on_error's: it raises on connecting too.)"""
    if is_unopenable(error):
        folder = os.path.dirname(path)
        default = not os.environ.get("VFOPS_DATABASE_URL")
        what = "VFOPS_HOME" if default else "registry database folder"
        fix = "set VFOPS_HOME to a writable folder" if default else _DATABASE_FIX
        check_writable_folder(folder, what=what, fix=fix)  # names the folder's problem
        raise VfopsError(unwritable_message(path, str(error)))


def _configure_sqlite(engine: Engine) -> None:
    path = sqlite_path(engine)
    assert path is not None

    @event.listens_for(engine, "handle_error")
    def _on_error(context: ExceptionContext) -> None:
        # A damaged or read-only file: no retry helps (RegistryUnavailable would retry
        # an OperationalError for VFOPS_REGISTRY_RETRY_S), and its traceback says nothing
        # a user can act on. Raised from here, it replaces SQLAlchemy's error.
        error = sqlite_error(context.original_exception, path)
        if error is not None:
            raise error

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
        # pysqlite's own BEGIN handling defers BEGIN past DDL and cannot take the
        # write lock up front; SQLAlchemy emits BEGIN itself (the "begin" hook).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # first, so that switching a new file to WAL also waits for other writers
        cursor.execute(f"PRAGMA busy_timeout={_SQLITE_BUSY_TIMEOUT_MS}")
        # WAL: readers never block the writer; NORMAL sync is durable in WAL mode
        # except for the last transactions on power loss, and much faster.
        _switch_to_wal(cursor)
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # Writers BEGIN IMMEDIATE: they wait (busy_timeout) for the write lock up
        # front, instead of failing with SQLITE_BUSY when a deferred read
        # transaction later tries to write while another writer committed.
        mode = connection.get_execution_options().get(_SQLITE_BEGIN, "DEFERRED")
        connection.exec_driver_sql(f"BEGIN {mode}")


def _switch_to_wal(cursor: Any) -> None:
    """``PRAGMA journal_mode=WAL``, retried while another connection holds the lock.

    Switching a new file to WAL needs an exclusive lock. When another connection is
    switching it at the same moment, SQLite answers ``database is locked`` at once
    instead of waiting ``busy_timeout`` (it would deadlock), e.g. two ``vfops env
    publish`` on a fresh registry: the second said it could not connect. The switch is
    retried until the busy timeout has passed.
    """
    deadline = time.monotonic() + _SQLITE_BUSY_TIMEOUT_MS / 1000
    delay = 0.001
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)  # the other connection's switch takes milliseconds
        delay = min(delay * 2, 0.05)


def _write_options(engine: Engine) -> dict[str, Any]:
    return {_SQLITE_BEGIN: "IMMEDIATE"} if engine.dialect.name == "sqlite" else {}


@contextmanager
def transaction(engine: Engine | None = None, *, write: bool = True) -> Iterator[Connection]:
    """A Core connection inside one transaction: committed on exit, rolled back on error.

    ``write=True`` takes SQLite's write lock at BEGIN (see ``_on_begin``); use
    ``write=False`` for read-only work so it never waits for a writer.
    """
    engine = engine or get_engine()
    with engine.connect() as connection:
        if write:
            connection.execution_options(**_write_options(engine))
        with connection.begin():
            yield connection
    if write:
        _stamp_after_write(engine)


@contextmanager
def session_scope(engine: Engine | None = None, *, write: bool = True) -> Iterator[Session]:
    """An ORM session inside one transaction: committed on exit, rolled back on error.

    Objects stay usable after the block (``expire_on_commit=False``), but
    relationships that were not loaded inside it cannot be loaded later.
    """
    engine = engine or get_engine()
    with Session(engine, expire_on_commit=False) as session, session.begin():
        if write:
            # procure the connection now so BEGIN IMMEDIATE applies to it
            session.connection(execution_options=_write_options(engine))
        yield session
    if write:
        _stamp_after_write(engine)


def _stamp_after_write(engine: Engine) -> None:
    # this process's own commit changed the file: it stays trusted (see _integrity)
    path = sqlite_path(engine)
    if path is not None:
        stamp_after_write(path)


# --- migrations -------------------------------------------------------------------


def alembic_config(url: str | None = None) -> Any:
    """An Alembic ``Config`` for ``url``, built in code (no alembic.ini needed)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # new revision files must be importable module names (mypy checks them)
    config.set_main_option("file_template", "v%%(rev)s_%%(slug)s")
    if url is not None:
        # ConfigParser interpolates '%': a URL-encoded password must survive it
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def _script_directory() -> Any:
    return _script_directory_at(str(MIGRATIONS_DIR))


@functools.cache
def _script_directory_at(location: str) -> Any:
    # parsed once per process: every first use of an engine asks for the head
    from alembic.script import ScriptDirectory

    config = alembic_config()
    config.set_main_option("script_location", location)
    return ScriptDirectory.from_config(config)


def head_revision() -> str:
    """The newest migration this code knows (the schema of ``_models.py``)."""
    head: str | None = _script_directory().get_current_head()
    if head is None:  # pragma: no cover - the package always ships migrations
        raise VfopsError(f"no migrations found in {MIGRATIONS_DIR}; reinstall vfops")
    return head


def _current_heads(connection: Connection) -> tuple[str, ...]:
    from alembic.runtime.migration import MigrationContext

    heads: tuple[str, ...] = MigrationContext.configure(connection).get_current_heads()
    return heads


def current_revision(url: str | None = None) -> str | None:
    """The database's revision, or ``None`` when it was never migrated."""
    engine = get_engine(url, check_schema=False)
    with transaction(engine, write=False) as connection:
        heads = _current_heads(connection)
    return ",".join(heads) if heads else None


def _run_alembic(connection: Connection, command_name: str, revision: str) -> None:
    from alembic import command
    from alembic.util import CommandError

    config = alembic_config()
    # env.py runs on this connection, inside the caller's transaction
    config.attributes["connection"] = connection
    try:
        getattr(command, command_name)(config, revision)
    except CommandError as exc:  # e.g. an unknown target revision
        raise VfopsError(f"alembic {command_name} to {revision!r} failed: {exc}") from exc


def _lock_for_migration(connection: Connection) -> None:
    # SQLite: BEGIN IMMEDIATE already holds the write lock. PostgreSQL: an advisory
    # lock, released at commit, so two first commands do not both migrate.
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})


def upgrade(url: str | None = None, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate the database up to ``revision``; returns (revision before, revision after)."""
    url = url or database_url()
    engine = get_engine(url, check_schema=False)
    with transaction(engine) as connection:
        _lock_for_migration(connection)
        before = _current_heads(connection)
        _check_known(url, before)
        if not before:
            _refuse_unversioned(connection)
        _run_alembic(connection, "upgrade", revision)
        after = _current_heads(connection)
    with _lock:
        _checked.discard(url)
    return (",".join(before) or None, ",".join(after) or None)


def downgrade(url: str | None, revision: str) -> None:
    """Migrate the database down to ``revision`` (``"base"`` drops every table)."""
    url = url or database_url()
    engine = get_engine(url, check_schema=False)
    with transaction(engine) as connection:
        _lock_for_migration(connection)
        _check_known(url, _current_heads(connection))
        _run_alembic(connection, "downgrade", revision)
    with _lock:
        _checked.discard(url)


def registry_tables() -> frozenset[str]:
    """The tables of the registry's models: what tells a vfops database from an empty one."""
    return frozenset(Base.metadata.tables)


def _refuse_unversioned(connection: Connection) -> None:
    # Migrating would fail on "table exists" halfway, or adopt unknown tables.
    existing = registry_tables() & set(inspect(connection).get_table_names())
    if existing:
        raise VfopsError(
            f"the registry database {connection.engine.url} has vfops tables "
            f"({', '.join(sorted(existing))}) but no migration history; point "
            "VFOPS_DATABASE_URL at an empty database or drop those tables"
        )


def _check_known(url: str, heads: tuple[str, ...]) -> None:
    for revision in heads:
        if not is_known_revision(revision):
            raise VfopsError(_ahead_message(url, revision))


def _ahead_message(url: str, revision: str) -> str:
    return (
        f"the registry database {mask_url(url)} is at revision {revision}, which this "
        f"vfops does not know (its newest is {head_revision()}): it was migrated by a "
        "newer vfops; upgrade vfops, or point VFOPS_DATABASE_URL at another database"
    )


def is_known_revision(revision: str) -> bool:
    """Whether ``revision`` is in this code's migration history."""
    from alembic.util import CommandError

    try:
        return _script_directory().get_revision(revision) is not None
    except CommandError:  # "No such revision or branch"
        return False


HEAD_REVISION: Final = "0008"
"""The newest migration (``head_revision()``, kept here so that the check every
process makes on its first connection needs neither Alembic nor the migration
scripts; a test keeps the two equal)."""


def _stored_revision(engine: Engine) -> str | None:
    """The revision in ``alembic_version``, read with one plain query (no Alembic)."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    with engine.connect() as connection:
        try:
            rows = connection.execute(text("SELECT version_num FROM alembic_version"))
            versions = list(rows.scalars())
        except DBAPIError:
            return None  # no table yet: the slow path below creates or refuses
        finally:
            connection.rollback()
    return versions[0] if len(versions) == 1 else None


def ensure_schema(engine: Engine) -> None:
    """Create the schema of an empty database; refuse one at another revision.

    Raises :class:`VfopsError` when the database is behind this code (run
    ``vfops db upgrade``), ahead of it (a newer vfops migrated it), or holds
    vfops tables without a migration history.
    """
    if _stored_revision(engine) == HEAD_REVISION:
        return  # the common case: no lock, one query, no Alembic import
    head = head_revision()
    with transaction(engine, write=False) as connection:
        heads = _current_heads(connection)
    if heads == (head,):
        return
    with transaction(engine) as connection:
        _lock_for_migration(connection)
        # re-read under the lock: another process may have migrated meanwhile
        heads = _current_heads(connection)
        if not heads:
            _refuse_unversioned(connection)
            _run_alembic(connection, "upgrade", "head")
            return
    if heads == (head,):
        return
    url = str(engine.url)
    _check_known(url, heads)
    raise VfopsError(
        f"the registry database {mask_url(url)} is at revision {','.join(heads)}, behind "
        f"this vfops ({head}); run `vfops db upgrade` to migrate it"
    )
