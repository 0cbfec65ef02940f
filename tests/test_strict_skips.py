"""``VFOPS_TEST_STRICT=1`` (set by ``.ci/run``) turns every skip into a failure, except
in tests marked ``opt_in``: CI cannot pass with PostgreSQL or torch missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

REPO = Path(__file__).resolve().parent.parent

SKIPPING_MODULE = """
import pytest

pytest.importorskip("vfops_no_such_module")


def test_never_collected() -> None:
    pass
"""

SKIPPING_TESTS = """
from pathlib import Path

import pytest

from tests.registry_fixtures import database_url


def test_skips() -> None:
    pytest.skip("a component is missing")


@pytest.mark.skipif(True, reason="a component is missing")
def test_skipif() -> None:
    pass


@pytest.mark.opt_in
@pytest.mark.skipif(True, reason="needs a set-up made by hand")
def test_opt_in() -> None:
    pass


def test_postgres(tmp_path: Path) -> None:
    next(database_url("postgresql", tmp_path))


def test_runs() -> None:
    pass
"""


_KINDS = {"failure": "failed", "error": "failed", "skipped": "skipped"}


def outcomes(tmp_path: Path, strict: str | None) -> dict[str, str]:
    """``{test or module name: "passed" | "failed" | "skipped"}`` of a pytest
    run over two test files that skip, with this project's settings and the plugin."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_module_skip.py").write_text(SKIPPING_MODULE)
    (tests / "test_skips.py").write_text(SKIPPING_TESTS)
    env = {
        **os.environ,
        # a closed port: PostgreSQL is "not reachable"
        "VFOPS_TEST_PG_URL": "postgresql+psycopg://postgres@127.0.0.1:9/test",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("VFOPS_TEST_STRICT", None)
    if strict is not None:
        env["VFOPS_TEST_STRICT"] = strict
    report = tmp_path / "report.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "--rootdir",
         str(tmp_path), "-p", "tests.strict_skips", "--continue-on-collection-errors",
         f"--junitxml={report}", str(tests)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=120, check=False,
    )  # fmt: skip
    found = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        # a module that skipped or failed at collection is named tests.<module>
        name = str(case.get("name")).removeprefix("tests.")
        kinds = [child.tag for child in case if child.tag in _KINDS]
        found[name] = _KINDS.get(kinds[0], "passed") if kinds else "passed"
    return found


@pytest.mark.parametrize("strict", [None, "0"])
def test_a_skip_is_a_skip_outside_ci(tmp_path: Path, strict: str | None) -> None:
    assert outcomes(tmp_path, strict) == {
        "test_module_skip": "skipped",
        "test_skips": "skipped",
        "test_skipif": "skipped",
        "test_opt_in": "skipped",
        "test_postgres": "skipped",
        "test_runs": "passed",
    }


def test_in_ci_every_skip_fails_but_opt_in(tmp_path: Path) -> None:
    assert outcomes(tmp_path, "1") == {
        "test_module_skip": "failed",
        "test_skips": "failed",
        "test_skipif": "failed",
        "test_opt_in": "skipped",
        "test_postgres": "failed",
        "test_runs": "passed",
    }
