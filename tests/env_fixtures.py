"""The CLI test environments (tests/fixtures/cli_envs), installed once per module.

``env_site`` reaches every test through ``pytest_plugins`` in ``tests/conftest.py``: take it
as an argument, do not import it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE_ENVS = Path(__file__).parent / "fixtures" / "cli_envs"


@pytest.fixture(scope="module")
def env_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """echo_env, no_prompt_env and raising_env pip-installed into a folder for PYTHONPATH."""
    site = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(site),
            str(FIXTURE_ENVS),
        ],
        check=True,
        capture_output=True,
    )
    return site
