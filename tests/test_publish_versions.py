"""Published versions are PEP 440 versions: every spelling of one is that one (issue 25,
item 8). ``0.1.00`` is 0.1.0, so publishing it with other content is refused like any
same-version publish, and looking it up finds 0.1.0.

On SQLite and PostgreSQL: the registry's own functions, then the real CLI end to end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from tests.registry_fixtures import DIALECTS, database_url
from tests.test_publish_and_provenance import artifact_files, cli, count_versions
from vfops._errors import VfopsError
from vfops.registry import (
    EnvironmentVersionRow,
    NewEnvironmentVersion,
    add_environment_version,
    find_version,
    get_engine,
    get_or_create_environment,
    list_versions,
    session_scope,
)


@pytest.fixture(params=DIALECTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path)


@pytest.fixture
def engine(db_url: str) -> Engine:
    return get_engine(db_url)


def publish_row(engine: Engine, version: str, content: str) -> EnvironmentVersionRow:
    with session_scope(engine) as session:
        return add_environment_version(
            session,
            NewEnvironmentVersion(
                "arith",
                version,
                content_hash=content,
                code_hash=f"code-{content}",
                wheel_sha256="w" * 64,
                sdist_sha256="s" * 64,
                wheel_uri=f"file:///artifacts/{content}.whl",
                sdist_uri=f"file:///artifacts/{content}.tar.gz",
            ),
        )


def stored_versions(engine: Engine) -> list[str]:
    with session_scope(engine, write=False) as session:
        return [row.version for row in list_versions(session, "arith")]


def test_a_version_is_stored_and_found_in_its_canonical_spelling(engine: Engine) -> None:
    assert publish_row(engine, "0.1.00", content="aaa").version == "0.1.0"
    assert publish_row(engine, "0.1.0", content="aaa").version == "0.1.0"  # the same: no-op
    with pytest.raises(VfopsError, match=r"arith@0\.1\.0 is already published with other"):
        publish_row(engine, "00.1.0", content="changed")
    assert stored_versions(engine) == ["0.1.0"]
    with session_scope(engine, write=False) as session:
        for spelling in ("0.1.0", "0.1.00", "v0.1.0", "00.01.000"):
            found = find_version(session, "arith", spelling)
            assert found is not None and found.version == "0.1.0", spelling
        assert find_version(session, "arith", "not-a-version") is None


def test_a_row_an_older_vfops_stored_unnormalised_is_that_version(engine: Engine) -> None:
    """Rows written before versions were normalised are looked up by number: no migration."""
    with session_scope(engine) as session:
        environment = get_or_create_environment(session, "arith")
        session.add(
            EnvironmentVersionRow(
                environment_id=environment.id,
                version="0.2.00",
                version_major=0,
                version_minor=2,
                version_patch=0,
                content_hash="old",
                code_hash="code-old",
                wheel_sha256="w" * 64,
                sdist_sha256="s" * 64,
                wheel_uri="file:///artifacts/old.whl",
                sdist_uri="file:///artifacts/old.tar.gz",
            )
        )
    with session_scope(engine, write=False) as session:
        found = find_version(session, "arith", "0.2.0")
        assert found is not None and found.content_hash == "old"
    with pytest.raises(VfopsError, match=r"arith@0\.2\.00 is already published with other"):
        publish_row(engine, "0.2.0", content="new")
    assert publish_row(engine, "0.2.0", content="old").version == "0.2.00"  # same content
    assert stored_versions(engine) == ["0.2.00"]


@pytest.mark.parametrize(
    ("version", "problem"),
    [
        ("0.1.x", r"'0\.1\.x' is not a valid PEP 440 version"),
        ("1.0", r"'1\.0' is not a plain MAJOR\.MINOR\.PATCH"),
        ("1.0.0rc1", r"'1\.0\.0rc1' is not a plain MAJOR\.MINOR\.PATCH"),
        ("1.0.0+local", r"'1\.0\.0\+local' is not a plain MAJOR\.MINOR\.PATCH"),
    ],
)
def test_a_version_that_is_not_plain_pep440_is_refused(
    engine: Engine, version: str, problem: str
) -> None:
    with pytest.raises(VfopsError, match=problem):
        publish_row(engine, version, content="aaa")
    assert stored_versions(engine) == []


def test_publishing_another_spelling_of_a_published_version(db_url: str, tmp_path: Path) -> None:
    artifacts = (tmp_path / "artifacts").as_uri()
    init = cli("env", "init", "ver_env", "--path", str(tmp_path), db=db_url, artifacts=artifacts)
    assert init.returncode == 0, init.stderr
    package = tmp_path / "ver_env"
    pyproject = package / "pyproject.toml"
    assert 'version = "0.1.0"' in pyproject.read_text()
    first = cli("env", "publish", str(package), db=db_url, artifacts=artifacts)
    assert first.returncode == 0 and "published ver_env@0.1.0 (" in first.stdout, first.stderr
    stored = artifact_files(artifacts)

    # other content, spelled 0.1.00: the same version, so refused, and nothing written
    pyproject.write_text(pyproject.read_text().replace('"0.1.0"', '"0.1.00"'))
    with (package / "ver_env.py").open("a") as handle:
        handle.write("\n# a change\n")
    edited = pyproject.read_text()
    refused = cli("env", "publish", str(package), db=db_url, artifacts=artifacts)
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        "error: ver_env@0.1.0 is already published with different content (version "
        f"'0.1.00' in pyproject.toml is 0.1.0) (content hash {first_hash(db_url)[:12]}, now "
        "different); versions are immutable: publish a new one with: vfops env publish "
        f"{package} --bump patch"
    ]
    assert count_versions(db_url) == 1 and artifact_files(artifacts) == stored
    assert pyproject.read_text() == edited

    # any spelling finds the version
    shown = cli("env", "show", "ver_env@0.1.00", db=db_url, artifacts=artifacts)
    assert shown.returncode == 0 and "ver_env@0.1.0" in shown.stdout, shown.stderr
    target = tmp_path / "installed"
    installed = cli(
        "env", "install", "ver_env@0.1.00", "--target", str(target), "--no-deps",
        db=db_url, artifacts=artifacts,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    assert installed.stdout.startswith("installed ver_env@0.1.0 ")
    assert (target / "ver_env.py").is_file()
    bad = cli("env", "show", "ver_env@0.1.x", db=db_url, artifacts=artifacts)
    assert bad.stderr.splitlines() == [
        "error: version '0.1.x' is not a valid PEP 440 version; use ver_env@MAJOR.MINOR.PATCH "
        "or ver_env@latest"
    ]

    # --bump goes past it; the wheel is named after the version the registry holds
    bumped = cli("env", "publish", str(package), "--bump", "patch", db=db_url, artifacts=artifacts)
    assert bumped.returncode == 0 and "published ver_env@0.1.1 (" in bumped.stdout, bumped.stderr
    with Session(get_engine(db_url)) as session:
        rows = list_versions(session, "ver_env")
        assert [(row.version, row.wheel_uri.rsplit("/", 1)[-1]) for row in rows] == [
            ("0.1.1", "ver_env-0.1.1-py3-none-any.whl"),
            ("0.1.0", "ver_env-0.1.0-py3-none-any.whl"),
        ]


def test_the_same_content_spelled_otherwise_is_a_no_op(db_url: str, tmp_path: Path) -> None:
    artifacts = (tmp_path / "artifacts").as_uri()
    cli("env", "init", "same_env", "--path", str(tmp_path), db=db_url, artifacts=artifacts)
    package = tmp_path / "same_env"
    pyproject = package / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"0.1.0"', '"0.1.00"'))
    first = cli("env", "publish", str(package), db=db_url, artifacts=artifacts)
    assert first.returncode == 0 and "published same_env@0.1.0 (" in first.stdout, first.stderr
    again = cli("env", "publish", str(package), db=db_url, artifacts=artifacts)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("same_env@0.1.0 already has this content")
    assert count_versions(db_url) == 1


def first_hash(db_url: str) -> str:
    with Session(get_engine(db_url)) as session:
        (row,) = list_versions(session, "ver_env")
        return row.content_hash
