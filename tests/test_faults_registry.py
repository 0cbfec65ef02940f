"""A damaged or unwritable SQLite registry through the real CLI (issue 25, defect 6):
one line naming the file (or VFOPS_HOME) and the fix, a non-zero exit, nothing written.

The registries are made by the real CLI (``vfops eval`` against the stub server), then
damaged the way disks and copies damage files: garbage over a b-tree page of the
rollouts table, or over the header.
"""

from __future__ import annotations

import hashlib
import random
import re
import sqlite3
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DatabaseError
from sqlalchemy.pool import NullPool

from tests.registry_fixtures import stored_count, stored_rollouts
from tests.strict_skips import STRICT_VAR, strict
from tests.test_bad_input import CLOSED_PG, MISSING_PG_DB, registry_url, vfops
from vfops._errors import VfopsError
from vfops.registry import _integrity, dispose_engines, get_engine
from vfops.testing import StubConfig, StubServer

DAMAGED = (
    r"^error: the registry database (?P<path>\S+) is damaged \((?P<problem>.+)\); restore it "
    r"from a backup, or move it aside with its -wal and -shm files \(vfops then creates a "
    r'new one\) after saving what it holds: sqlite3 (?P=path) "\.recover" > recovered\.sql$'
)
ROLLOUTS_QUERY = "SELECT example_id, rollout_index, completion FROM rollouts ORDER BY id"


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(reply_mode="echo_answer")) as server:
        yield server


def eval_args(stub: StubServer, out: Path, n: int = 20) -> list[str]:
    return ["eval", "arithmetic", "-a", f'{{"num_examples": {n}}}', "-m", "stub-model",
            "-n", str(n), "-r", "3", "-b", stub.base_url, "-o", str(out), "-q"]  # fmt: skip


def make_registry(tmp: Path, stub: StubServer) -> Path:
    """A registry holding one completed run of 60 rollouts, written by the CLI, with its
    WAL checkpointed into the file (as after any later command closed it)."""
    (tmp / "home").mkdir(exist_ok=True)
    proc = vfops(eval_args(stub, tmp / "first"), tmp, {})
    assert proc.returncode == 0, proc.stderr
    database = tmp / "home" / "registry.db"
    with sqlite3.connect(database) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return database


def rollout_leaf_pages(database: Path) -> list[int]:
    """The leaf pages of the rollouts table's b-tree (read from its root page)."""
    with sqlite3.connect(database) as connection:
        (root,) = connection.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'rollouts'"
        ).fetchone()
        (page_size,) = connection.execute("PRAGMA page_size").fetchone()
    data = database.read_bytes()
    page = data[(root - 1) * page_size : root * page_size]
    assert page[0] == 0x05, "the rollouts table fits one page: write more rollouts"
    (cells,) = struct.unpack(">H", page[3:5])
    pointers = struct.unpack(f">{cells}H", page[12 : 12 + 2 * cells])
    return [struct.unpack(">I", page[p : p + 4])[0] for p in pointers]


def damage_a_rollouts_page(database: Path) -> int:
    """Garbage over the middle of a leaf page of the rollouts table; that page."""
    with sqlite3.connect(database) as connection:
        (page_size,) = connection.execute("PRAGMA page_size").fetchone()
    leaves = rollout_leaf_pages(database)
    page = leaves[len(leaves) // 2]
    garbage = random.Random(25).randbytes(page_size // 2)
    with database.open("r+b") as out:
        out.seek((page - 1) * page_size + page_size // 4)
        out.write(garbage)
    return page


def rollouts_plainly(database: Path) -> list[tuple[object, ...]]:
    engine = create_engine(f"sqlite:///{database}", poolclass=NullPool)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(ROLLOUTS_QUERY))]
    finally:
        engine.dispose()


def files_of(database: Path) -> tuple[bytes, int]:
    """What the registry holds: the file's content (its hash) and its WAL's size (an
    empty WAL comes and goes with connections; a write adds frames to it)."""
    wal = Path(str(database) + "-wal")
    return hashlib.sha256(database.read_bytes()).digest(), wal.stat().st_size if wal.exists() else 0


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_a_damaged_rollouts_page_is_one_line_and_nothing_is_written(
    tmp_path: Path, stub: StubServer
) -> None:
    database = make_registry(tmp_path, stub)
    before = rollouts_plainly(database)
    assert len(before) == 60

    page = damage_a_rollouts_page(database)

    # what a plain SQLAlchemy query makes of it: an error, or rows that are not the rows
    try:
        after = rollouts_plainly(database)
    except DatabaseError:
        pass
    else:
        assert after != before
    run_id = get_run_id(database)
    files = files_of(database)
    for args in (
        ["runs", "list"],
        ["runs", "show", run_id],
        eval_args(stub, tmp_path / "second"),
    ):
        line = one_error_line(vfops(args, tmp_path, {}))
        match = re.match(DAMAGED, line)
        assert match, line
        assert match["path"] == str(database)
        assert f"page {page}" in match["problem"], line
    assert files_of(database) == files, "the damaged registry was written to"
    assert not (tmp_path / "second").exists(), "the eval wrote a run folder"


def get_run_id(database: Path) -> str:
    with sqlite3.connect(database) as connection:
        (run_id,) = connection.execute("SELECT id FROM eval_runs").fetchone()
    return str(run_id)


def test_a_file_that_is_not_a_database_is_one_line(tmp_path: Path, stub: StubServer) -> None:
    database = make_registry(tmp_path, stub)
    with database.open("r+b") as out:
        out.write(b"not a database, whatever it was" * 4)  # over the header
    files = files_of(database)
    for args in (["runs", "list"], ["db", "current"], eval_args(stub, tmp_path / "second")):
        line = one_error_line(vfops(args, tmp_path, {}))
        match = re.match(DAMAGED, line)
        assert match and match["problem"] == "file is not a database", line
    assert files_of(database) == files
    assert not (tmp_path / "second").exists()


def test_damage_after_the_check_is_one_line_too(tmp_path: Path, stub: StubServer) -> None:
    """A file damaged while a process has it open (checked, and stamped): the query that
    meets the damage raises the same one-line error, not SQLAlchemy's."""
    database = make_registry(tmp_path, stub)
    engine = get_engine(registry_url(tmp_path))
    run_id = get_run_id(database)
    assert stored_count(engine, run_id) == 60
    damage_a_rollouts_page(database)
    engine.dispose()  # no page of the file stays cached
    try:
        with pytest.raises(VfopsError, match=r"is damaged \(database disk image is malformed\)"):
            list(stored_rollouts(engine, run_id))
    finally:
        dispose_engines()


def test_an_unchanged_file_is_not_checked_again(tmp_path: Path, stub: StubServer) -> None:
    """The check reads the whole file (seconds for a large registry on a cold disk): a
    file as its stamp says (inode, size, ctime of it and its WAL) is not read again."""
    database = make_registry(tmp_path, stub)
    # the run's process checked the file, and stamped it again after its own writes
    assert Path(str(database) + _integrity.STAMP_SUFFIX).exists()
    damage_a_rollouts_page(database)
    url = registry_url(tmp_path)
    with pytest.raises(VfopsError, match="is damaged"):
        get_engine(url)
    # stamped as it is now (as if checked): not checked, so it opens
    _integrity._write_stamp(str(database))
    get_engine(url)
    dispose_engines()
    Path(str(database) + _integrity.STAMP_SUFFIX).unlink()
    with pytest.raises(VfopsError, match="is damaged"):
        get_engine(url)


def test_another_sqlite_error_is_one_line(tmp_path: Path, stub: StubServer) -> None:
    database = make_registry(tmp_path, stub)
    with sqlite3.connect(database) as connection:  # a table lost (a bad hand edit)
        connection.execute("DROP TABLE eval_runs")  # what `runs list` reads (alone)
    line = one_error_line(vfops(["runs", "list"], tmp_path, {}))
    assert line == (
        f"error: the registry database sqlite:///{database} failed (no such table: eval_runs); "
        "check its file and folder (free space, permissions, another process holding it), "
        "or set VFOPS_HOME or VFOPS_DATABASE_URL to another database"
    )


# --- a read-only VFOPS_HOME ------------------------------------------------------------


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def read_only_home(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path/home`` on a tmpfs remounted read-only (root ignores permission bits,
    so chmod 555 would not stop the test's own writes)."""
    home = tmp_path / "home"
    home.mkdir()
    try:
        _mount("-t", "tmpfs", "-o", "size=16m", "tmpfs", str(home))
    except (OSError, subprocess.CalledProcessError) as exc:
        problem = f"cannot mount a tmpfs (needs root): {exc}"
        if strict():
            pytest.fail(f"{problem}; {STRICT_VAR}=1 (CI) needs it")
        pytest.skip(problem)
    try:
        yield home
    finally:
        subprocess.run(["umount", str(home)], check=False, capture_output=True)


@pytest.mark.parametrize("with_registry", [False, True], ids=["empty", "with-registry"])
def test_a_read_only_home_is_one_line_naming_vfops_home(
    read_only_home: Path, tmp_path: Path, stub: StubServer, with_registry: bool
) -> None:
    if with_registry:
        proc = vfops(eval_args(stub, tmp_path / "first", n=2), tmp_path, {})
        assert proc.returncode == 0, proc.stderr
    _mount("-o", "remount,ro", str(read_only_home))
    expected = (
        f"error: VFOPS_HOME {read_only_home} cannot be written (Read-only file system); "
        "set VFOPS_HOME to a writable folder"
    )
    tracking_on = {"VFOPS_TRACKING": "1"}  # the default, which the helper turns off
    for args in (eval_args(stub, tmp_path / "second", n=2), ["runs", "list"]):
        assert one_error_line(vfops(args, tmp_path, tracking_on)) == expected
    assert not (tmp_path / "second").exists()


def test_a_registry_url_in_a_read_only_folder_is_one_line(
    read_only_home: Path, tmp_path: Path
) -> None:
    """VFOPS_DATABASE_URL names a file in a read-only folder (the home is writable)."""
    _mount("-o", "remount,ro", str(read_only_home))
    extra = {
        "VFOPS_HOME": str(tmp_path / "writable-home"),
        "VFOPS_DATABASE_URL": f"sqlite:///{read_only_home}/registry.db",
    }
    assert one_error_line(vfops(["runs", "list"], tmp_path, extra)) == (
        f"error: registry database folder {read_only_home} cannot be written (Read-only file "
        "system); fix the database URL (VFOPS_DATABASE_URL; vfops db: --url)"
    )


def test_a_registry_that_does_not_answer_at_start_is_an_outage_not_bad_input(
    tmp_path: Path, stub: StubServer
) -> None:
    """PostgreSQL not answering when the eval starts (nothing listens on its port): exit
    1 (an outage), one line naming the registry; no model call made, no run folder. A
    database that does not exist is bad input: exit 2."""
    asked = stub.stats["requests"]
    down = vfops(eval_args(stub, tmp_path / "out"), tmp_path, {"VFOPS_DATABASE_URL": CLOSED_PG})
    assert down.returncode == 1, down.stderr
    line = one_error_line(down)
    assert "cannot connect to the registry database" in line and "127.0.0.1:9" in line, line
    assert "Connection refused" in line, line
    assert stub.stats["requests"] == asked
    assert not (tmp_path / "out").exists()
    missing = vfops(
        eval_args(stub, tmp_path / "out2"), tmp_path, {"VFOPS_DATABASE_URL": MISSING_PG_DB}
    )
    assert missing.returncode == 2, missing.stderr
    assert "vfops_no_such_database" in one_error_line(missing)


def test_garbage_read_as_text_is_the_damaged_file_error(tmp_path: Path) -> None:
    """Damage that lands inside a text value (not the page's structure) reaches Python as
    sqlite3's UTF-8 decoding error: the same one-line damaged-file error, never
    SQLAlchemy's (the CI failure of 2026-12-06: the damaged page's layout depends on the
    rows written)."""
    undecodable = sqlite3.OperationalError(
        "Could not decode to UTF-8 column 'trace_id' with text '2f\ufffd'"
    )
    error = _integrity.sqlite_error(undecodable, str(tmp_path / "r.db"))
    assert isinstance(error, VfopsError)
    assert "is damaged (database disk image is malformed)" in str(error), error
    assert _integrity.sqlite_error(sqlite3.OperationalError("database is locked"), "x") is None
