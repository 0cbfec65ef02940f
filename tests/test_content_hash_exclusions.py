"""What an environment's content hash leaves out, and nothing more (issue 44, item 11).

Build output (``build``, ``dist``, ``outputs``) and virtualenvs are left out only as
folders at the package's root; a sub-folder with one of those names is content, so a
change there is published. Caches (``__pycache__``, ``*.pyc``) are left out anywhere.
``vfops env publish --help`` lists exactly what is left out.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.registry_fixtures import DIALECTS, database_url
from vfops.publishing import content_hash
from vfops.publishing._hashing import (
    EXCLUDED_ANYWHERE,
    EXCLUDED_AT_ROOT,
    EXCLUDED_DIR_SUFFIXES,
    EXCLUDED_FILE_SUFFIXES,
)


def _package(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "pkg"\nversion = "0.1.0"\n')
    (root / "pkg.py").write_text("def load_environment(): ...\n")
    return root


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(
    "relpath",
    [
        "sub/build/x.py",
        "sub/dist/data.json",
        "pkg_data/outputs/expected.txt",
        "a/b/venv/module.py",  # a sub-package may be named venv
        "build",  # a file named build at the root is not the build folder
    ],
)
def test_a_change_under_a_nested_build_folder_changes_the_hash(
    tmp_path: Path, relpath: str
) -> None:
    package = _package(tmp_path / "pkg")
    _write(package / relpath, "one\n")
    before = content_hash(package)
    _write(package / relpath, "two\n")
    assert content_hash(package) != before


@pytest.mark.parametrize(
    "relpath",
    [
        "build/lib/pkg.py",
        "dist/pkg-0.1.0.tar.gz",
        "outputs/evals/run/results.jsonl",
        ".venv/lib/site.py",
        "venv/bin/python",
        ".tox/py311/log",
        ".eggs/dep.egg",
        "__pycache__/pkg.cpython-311.pyc",
        "sub/deep/__pycache__/x.cpython-311.pyc",
        "sub/deep/x.pyc",
        "sub/.git/HEAD",
        "src/pkg.egg-info/PKG-INFO",
        "sub/.pytest_cache/v/cache",
    ],
)
def test_build_output_at_the_root_and_caches_anywhere_are_not_content(
    tmp_path: Path, relpath: str
) -> None:
    package = _package(tmp_path / "pkg")
    before = content_hash(package)
    _write(package / relpath, "anything\n")
    assert content_hash(package) == before


def test_publish_help_names_every_exclusion() -> None:
    from vfops.cli._app import app

    result = CliRunner().invoke(app, ["env", "publish", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    names = [*EXCLUDED_ANYWHERE, *EXCLUDED_AT_ROOT]
    names += [f"*{suffix}" for suffix in (*EXCLUDED_DIR_SUFFIXES, *EXCLUDED_FILE_SUFFIXES)]
    for name in names:
        assert f" {name}" in text, name
    assert "root only: the build, dist, outputs" in text
    assert "a sub-folder named build, dist or outputs is hashed" in text


@pytest.fixture(params=DIALECTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path)


def test_a_change_under_sub_build_is_published(db_url: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "VFOPS_DATABASE_URL": db_url,
        "VFOPS_ARTIFACTS": (tmp_path / "artifacts").as_uri(),
        "VFOPS_HOME": str(tmp_path / "home"),
    }

    def vfops(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "vfops", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )

    assert vfops("env", "init", "nested_env", "--path", str(tmp_path)).returncode == 0
    package = tmp_path / "nested_env"
    _write(package / "sub" / "build" / "x.py", "VALUE = 1\n")
    first = vfops("env", "publish", str(package))
    assert first.returncode == 0, first.stderr
    assert "published nested_env@0.1.0" in first.stdout

    _write(package / "sub" / "build" / "x.py", "VALUE = 2\n")
    bumped = vfops("env", "publish", str(package), "--bump", "patch")
    assert bumped.returncode == 0, bumped.stderr
    assert "published nested_env@0.1.1" in bumped.stdout, bumped.stdout

    # root build output is not content: nothing to publish, even with --bump
    _write(package / "build" / "lib" / "x.py", "VALUE = 3\n")
    again = vfops("env", "publish", str(package), "--bump", "patch")
    assert again.returncode == 0, again.stderr
    assert "nested_env@0.1.1 already has this content" in again.stdout
    assert "nothing published" in again.stdout
