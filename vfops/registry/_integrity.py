"""The SQLite registry's integrity: checked when a process first opens the file, and
SQLite's own errors about a damaged or unwritable file said in one line.

``PRAGMA quick_check`` reads every page of the file: measured on a registry of 100k
rollouts (500 MB) it takes ~0.27 s with the file in the page cache and 7-9 s from a
cold disk, too much for every ``vfops runs list``. So a check that passes leaves a
stamp (``registry.db-checked``: the identity of the file and its WAL: inode, size,
ctime) and the next process checks again only when the file is not as stamped. A
process that checked (or found the stamp valid) stamps again after its own writes and
when it closes its connections (SQLite's checkpoint rewrites the file then): changes
made through SQLite are trusted; any other change (a copy over it, a restore, a torn
write after a crash, another program) leaves the file unlike its stamp, so it is
checked. Damage that changes no byte count or timestamp (bit rot) is not caught here;
SQLite raises "database disk image is malformed" when it reads such a page, and that
is one line too (:func:`sqlite_error`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson

from vfops._errors import VfopsError

if TYPE_CHECKING:
    from sqlalchemy import Engine

STAMP_SUFFIX: Final = "-checked"

# SQLite's primary result codes (https://sqlite.org/rescode.html)
_SQLITE_READONLY: Final = 8
_SQLITE_CORRUPT: Final = 11
_SQLITE_CANTOPEN: Final = 14
_SQLITE_NOTADB: Final = 26

_lock = threading.Lock()
_verified: set[str] = set()
"""Files this process checked (or found stamped), whose own later writes it stamps."""


def corrupt_message(path: str, problem: str) -> str:
    """One line naming the damaged file and the fix."""
    problem = " ".join(problem.replace("*** in database main ***", "").split())
    if len(problem) > 300:
        problem = problem[:300] + "..."
    return (
        f"the registry database {path} is damaged ({problem}); restore it from a backup, "
        f"or move it aside with its -wal and -shm files (vfops "
        f'then creates a new one) after saving what it holds: sqlite3 {path} ".recover" '
        "> recovered.sql"
    )


def unwritable_message(path: str, problem: str) -> str:
    return (
        f"the registry database {path} cannot be written ({problem}); make it and its folder "
        "writable, or set VFOPS_HOME (or VFOPS_DATABASE_URL) to a writable place"
    )


def _code(error: BaseException) -> int | None:
    code = getattr(error, "sqlite_errorcode", None)  # Python 3.11+
    return code & 0xFF if isinstance(code, int) else None


_UNDECODABLE = "Could not decode to UTF-8"
"""Python's sqlite3 reading a text value that is not UTF-8: a damaged page."""


def is_damaged(error: BaseException) -> bool:
    """Whether ``error`` (a DBAPI error) says the file is damaged or not a database."""
    if not isinstance(error, sqlite3.DatabaseError):
        return False
    if _UNDECODABLE in str(error):
        return True
    code = _code(error)
    if code is not None:
        return code in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    text = str(error)
    return "malformed" in text or "not a database" in text


def sqlite_error(error: BaseException, path: str) -> VfopsError | None:
    """The one-line error for a SQLite error that no retry fixes: a damaged file, or one
    that cannot be written; None for the others (busy, a missing table...)."""
    if is_damaged(error):
        reason = str(error)
        if _UNDECODABLE in reason:
            # garbage read as a text value (vfops writes only UTF-8): what SQLite reports
            # as malformed when the damage hits the page's structure instead
            reason = "database disk image is malformed"
        return VfopsError(corrupt_message(path, reason))
    if isinstance(error, sqlite3.DatabaseError) and _code(error) == _SQLITE_READONLY:
        return VfopsError(unwritable_message(path, str(error)))
    return None


def is_unopenable(error: BaseException) -> bool:
    """SQLite could not open (or create) the file, or write what opening needs."""
    return isinstance(error, sqlite3.DatabaseError) and _code(error) in (
        _SQLITE_CANTOPEN,
        _SQLITE_READONLY,
    )


def _identity(path: str) -> list[Any] | None:
    """What changes when anything rewrites the file or its WAL (ctime: no tool can set
    it back). An empty WAL is none: opening creates one, closing removes it."""
    try:
        db = os.stat(path)
    except FileNotFoundError:
        return None
    found: list[Any] = [db.st_dev, db.st_ino, db.st_size, db.st_ctime_ns]
    with contextlib.suppress(FileNotFoundError):
        wal = os.stat(path + "-wal")
        if wal.st_size:
            found += [wal.st_ino, wal.st_size, wal.st_ctime_ns]
    return found


def _read_stamp(path: str) -> Any:
    try:
        return orjson.loads(Path(path + STAMP_SUFFIX).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None


def _write_stamp(path: str) -> None:
    identity = _identity(path)
    if identity is None:
        return
    folder = os.path.dirname(path) or "."
    try:
        fd, temporary = tempfile.mkstemp(prefix=".registry-check-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(orjson.dumps(identity))
            os.replace(temporary, path + STAMP_SUFFIX)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
    except OSError:  # a read-only folder: the next process checks again
        pass


def check_integrity(engine: Engine, path: str) -> None:
    """``PRAGMA quick_check`` of the SQLite file ``path`` unless it is as stamped;
    a one-line :class:`VfopsError` when it is damaged."""
    from sqlalchemy.exc import DBAPIError

    with _lock:
        if path in _verified:
            return
    identity = _identity(path)
    if identity is not None and identity != _read_stamp(path):
        try:
            with engine.connect() as connection:
                rows = connection.exec_driver_sql("PRAGMA quick_check(1)").scalars().all()
        except DBAPIError as exc:  # the schema itself is unreadable
            raise VfopsError(corrupt_message(path, str(exc.orig))) from None
        if rows != ["ok"]:
            raise VfopsError(corrupt_message(path, str(rows[0] if rows else "no answer")))
        _write_stamp(path)
    with _lock:
        _verified.add(path)


def stamp_after_write(path: str) -> None:
    """This process wrote to ``path`` through SQLite: stamp it again, if it was checked."""
    if path in _verified:
        _write_stamp(path)


def forget_checked(paths: list[str]) -> None:
    """The connections to ``paths`` are closed: stamp them as they are now (the close
    checkpoints the WAL into the file) and check them again on the next open."""
    with _lock:
        checked = [path for path in paths if path in _verified]
        _verified.difference_update(paths)
    for path in checked:
        _write_stamp(path)
