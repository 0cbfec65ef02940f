"""CI runs every test: with ``VFOPS_TEST_STRICT=1`` a skipped test or module fails.

Tests skip when a real component is missing (PostgreSQL not reachable, torch not
installed): convenient on a laptop, but a CI run that skipped them would pass without
testing them. ``.ci/run`` sets ``VFOPS_TEST_STRICT=1``, and every skip (``pytest.skip``,
``importorskip``, ``skipif``), at collection or in a test, is then reported as a
failure naming its reason. Only tests marked ``opt_in`` (documented, set up by hand;
none at present: the real-vLLM tests run in CI, on the venv ``.ci/run`` builds) may
still skip.

Registered through ``pytest_plugins`` in ``tests/conftest.py``.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

STRICT_VAR = "VFOPS_TEST_STRICT"


def strict() -> bool:
    """Whether skipping is a failure (CI)."""
    return os.environ.get(STRICT_VAR, "") not in ("", "0")


def _fail(report: pytest.CollectReport | pytest.TestReport) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (
        f"skipped, and {STRICT_VAR}=1 makes a skip a failure: {reason} "
        "(install or start the component; mark a test that needs a hand-made set-up opt_in)"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if strict() and report.skipped:
        _fail(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    # an xfail is reported as a skip that has ``wasxfail``: not a skip
    xfailed = hasattr(report, "wasxfail")
    if strict() and report.skipped and not xfailed and item.get_closest_marker("opt_in") is None:
        _fail(report)
