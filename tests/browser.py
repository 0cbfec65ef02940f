"""A page as a user sees it: headless Chromium (Debian's ``chromium`` package).

The Prefect and MLflow UIs are single-page apps: what a user reads exists only
after their JavaScript has run and fetched from the API. ``--dump-dom`` with a
virtual-time budget gives the rendered DOM; ``--screenshot`` the picture, kept
under :func:`artifacts_dir` for a person to look at (CI keeps the folder).

``.ci/run`` installs the package; a missing browser fails the test that needs it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def chromium() -> str:
    """The Chromium executable, or a test failure that says how to install it."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        "headless Chromium is not installed; run `apt-get install -y chromium` (.ci/run does)"
    )


def artifacts_dir() -> Path:
    """Where tests keep screenshots: ``$VFOPS_TEST_ARTIFACTS``, else ``test-artifacts/``
    (git-ignored)."""
    folder = Path(os.environ.get("VFOPS_TEST_ARTIFACTS") or REPO_ROOT / "test-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _base_args(width: int, height: int, budget_ms: int, profile: str) -> list[str]:
    return [
        chromium(),
        "--headless",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--no-first-run",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        f"--virtual-time-budget={budget_ms}",
    ]


def render(
    url: str,
    *,
    screenshot: str | None = None,
    width: int = 1440,
    height: int = 1000,
    budget_ms: int = 20_000,
    timeout_s: float = 120,
) -> str:
    """The DOM of ``url`` after its scripts ran (and a screenshot named ``screenshot``)."""
    target = artifacts_dir() / screenshot if screenshot else None
    with tempfile.TemporaryDirectory(prefix="vfops-chromium-") as profile:
        args = _base_args(width, height, budget_ms, profile)
        # one page load gives both: the DOM on stdout and the picture of the same render
        shot = [f"--screenshot={target}"] if target else []
        if target:
            target.unlink(missing_ok=True)  # an earlier run's picture proves nothing
        dom = subprocess.run(
            [*args, "--dump-dom", *shot, url],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        ).stdout
    if target:
        assert target.is_file() and target.stat().st_size > 0, f"no screenshot at {target}"
    return dom


def visible_text(dom: str) -> str:
    """The DOM's text without tags, scripts and styles (roughly what is on screen)."""
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))
