"""Registry database: engines, migrations, schema checks, ``vfops db``.

Every test runs on SQLite (a temporary file) and on PostgreSQL (a fresh schema).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, make_url, text
from typer.testing import CliRunner

from tests.registry_fixtures import DIALECTS, database_url
from vfops._errors import VfopsError
from vfops.cli._db import app as db_app
from vfops.registry import (
    Base,
    _db,
    current_revision,
    downgrade,
    get_engine,
    head_revision,
    upgrade,
)

EXTRA_REVISION = '''"""Test-only revision after head.

Why: lets a test put a database behind the code's head.
"""

import sqlalchemy as sa
from alembic import op

revision = "9999extra"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("extra_probe", sa.Column("id", sa.Integer(), primary_key=True))


def downgrade() -> None:
    op.drop_table("extra_probe")
'''


@pytest.fixture(params=DIALECTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path)


def _tables(url: str) -> set[str]:
    with get_engine(url, check_schema=False).connect() as connection:
        return set(inspect(connection).get_table_names())


def _with_extra_revision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point vfops at a copy of its migrations with one more revision (0002)."""
    scripts = tmp_path / "migrations"
    shutil.copytree(_db.MIGRATIONS_DIR, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    head = head_revision()
    (scripts / "versions" / "v9999_extra.py").write_text(EXTRA_REVISION.replace("{head}", head))
    monkeypatch.setattr(_db, "MIGRATIONS_DIR", scripts)
    monkeypatch.setattr(_db, "HEAD_REVISION", "9999extra")  # as a release would move it


# --- migration history ----------------------------------------------------------------


def test_the_fast_schema_check_knows_the_head() -> None:
    from vfops.registry._db import HEAD_REVISION

    assert head_revision() == HEAD_REVISION  # a new migration must move HEAD_REVISION too


def test_history_has_one_head_and_every_revision_says_why() -> None:
    script = ScriptDirectory.from_config(_db.alembic_config())
    assert script.get_heads() == [head_revision()]
    for revision in script.walk_revisions():
        doc = revision.module.__doc__ or ""
        assert "Why:" in doc, f"revision {revision.revision} has no 'Why:' in its docstring"


def test_migrations_ship_inside_the_package() -> None:
    import vfops

    package = Path(vfops.__file__).parent
    assert _db.MIGRATIONS_DIR.is_relative_to(package)
    assert (_db.MIGRATIONS_DIR / "env.py").is_file()
    # regular packages, so setuptools puts every revision into a wheel
    assert (_db.MIGRATIONS_DIR / "__init__.py").is_file()
    assert (_db.MIGRATIONS_DIR / "versions" / "__init__.py").is_file()


def test_import_vfops_and_the_db_cli_load_no_sqlalchemy() -> None:
    code = (
        "import sys, vfops, vfops.cli._db; vfops.__version__; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'alembic')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- schema ---------------------------------------------------------------------------


def test_upgrade_head_yields_exactly_the_models(db_url: str) -> None:
    before, after = upgrade(db_url)
    assert (before, after) == (None, head_revision())
    engine = get_engine(db_url, check_schema=False)
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "compare_server_default": True}
        )
        assert compare_metadata(context, Base.metadata) == []
        # the version table lives beside the tables (per PostgreSQL schema)
        assert "alembic_version" in inspect(connection).get_table_names()


def test_upgrade_twice_is_a_no_op(db_url: str) -> None:
    upgrade(db_url)
    assert upgrade(db_url) == (head_revision(), head_revision())


def test_downgrade_base_leaves_no_tables(db_url: str) -> None:
    upgrade(db_url)
    downgrade(db_url, "base")
    # Alembic keeps its (now empty) version table; nothing of the registry remains
    assert _tables(db_url) <= {"alembic_version"}
    assert current_revision(db_url) is None


def test_first_use_creates_the_schema(db_url: str) -> None:
    if db_url.startswith("sqlite"):
        # the home folder does not exist yet: the engine creates it
        assert not Path(make_url(db_url).database or "").parent.exists()
    assert current_revision(db_url) is None
    get_engine(db_url)
    assert current_revision(db_url) == head_revision()
    assert {"rollouts", "eval_runs", "judge_cache"} <= _tables(db_url)


def test_default_database_is_sqlite_under_vfops_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VFOPS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("VFOPS_DATABASE_URL", raising=False)
    try:
        engine = get_engine()
        assert engine.url.database == str(tmp_path / "home" / "registry.db")
        assert current_revision() == head_revision()
    finally:
        _db.dispose_engines()


def test_sqlite_connection_settings(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    try:
        with get_engine(url).connect() as connection:
            pragma = {
                name: connection.exec_driver_sql(f"PRAGMA {name}").scalar()
                for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
            }
    finally:
        _db.dispose_engines()
    # synchronous 1 = NORMAL
    assert pragma == {
        "journal_mode": "wal",
        "synchronous": 1,
        "foreign_keys": 1,
        "busy_timeout": 30_000,
    }


def test_connections_opening_a_fresh_sqlite_file_together_all_connect(tmp_path: Path) -> None:
    """Eight connections switching a new file to WAL at the same moment: SQLite answers
    some of them "database is locked" at once, without waiting its busy timeout (two
    `vfops env publish` on a fresh registry, one "cannot connect"). Every one connects.

    A race: without the retry about 3 % of rounds fail here, so 300 rounds miss it
    with a probability of ~1e-4; with it, no round can fail.
    """
    import threading

    from sqlalchemy import create_engine

    failures: list[str] = []
    for round_ in range(300):
        url = f"sqlite:///{tmp_path / f'r{round_}.db'}"
        together = threading.Barrier(8)

        def connect(url: str = url, together: threading.Barrier = together) -> None:
            engine = create_engine(url)
            _db._configure_sqlite(engine)
            together.wait()
            try:
                with engine.connect() as connection:
                    connection.exec_driver_sql("SELECT 1")
            except Exception as exc:
                failures.append(str(exc).splitlines()[0])
            finally:
                engine.dispose()

        threads = [threading.Thread(target=connect) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failures == []


def test_concurrent_first_use_migrates_once(db_url: str) -> None:
    code = "import sys; from vfops.registry import get_engine; get_engine(sys.argv[1])"
    processes = [
        subprocess.Popen([sys.executable, "-c", code, db_url], stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    errors = [process.communicate(timeout=120)[1].decode() for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], errors
    assert current_revision(db_url) == head_revision()


# --- refusing a database at another revision ------------------------------------------


def test_database_behind_head_is_refused_until_upgraded(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upgrade(db_url)  # at the real head
    real_head = head_revision()
    _with_extra_revision(tmp_path, monkeypatch)  # now this code's head is one more
    assert head_revision() == "9999extra"
    with pytest.raises(VfopsError) as excinfo:
        get_engine(db_url)
    message = str(excinfo.value)
    assert "\n" not in message
    assert "vfops db upgrade" in message
    assert real_head in message and "9999extra" in message

    result = CliRunner().invoke(db_app, ["upgrade", "--url", db_url])
    assert result.exit_code == 0, result.output
    assert f"from {real_head} to 9999extra" in result.output
    get_engine(db_url)  # accepted now
    assert "extra_probe" in _tables(db_url)


def test_database_ahead_of_code_is_refused(db_url: str) -> None:
    upgrade(db_url)
    with get_engine(db_url, check_schema=False).begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(VfopsError, match="newer vfops") as excinfo:
        get_engine(db_url)
    assert "\n" not in str(excinfo.value)
    with pytest.raises(VfopsError, match="newer vfops"):
        upgrade(db_url)


def test_tables_without_history_are_refused(db_url: str) -> None:
    upgrade(db_url)
    with get_engine(db_url, check_schema=False).begin() as connection:
        connection.execute(text("DROP TABLE alembic_version"))
    with pytest.raises(VfopsError, match="no migration history"):
        get_engine(db_url)
    with pytest.raises(VfopsError, match="no migration history"):
        upgrade(db_url)


# --- vfops db ---------------------------------------------------------------------------


def test_db_current_masks_the_password(db_url: str) -> None:
    url = db_url
    if url.startswith("postgresql"):
        # trust authentication ignores the password; it must never be printed
        url = make_url(url).set(password="s3cret").render_as_string(hide_password=False)
    runner = CliRunner()
    result = runner.invoke(db_app, ["current", "--url", url])
    assert result.exit_code == 0, result.output
    assert "s3cret" not in result.output
    assert "current:  (none)" in result.output
    assert f"head:     {head_revision()}" in result.output
    if url.startswith("postgresql"):
        assert "postgres:***@" in result.output

    assert runner.invoke(db_app, ["upgrade", "--url", url]).exit_code == 0
    result = runner.invoke(db_app, ["current", "--url", url])
    assert f"current:  {head_revision()}" in result.output
    assert "up to date" in result.output
