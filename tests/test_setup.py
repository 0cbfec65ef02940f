"""``make``'s set-up: what a user's virtualenv gets, and what only the tests' does.

Read from ``make --dry-run`` against a virtualenv path that does not exist, so every
recipe of the graph is printed (nothing is run).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _planned(target: str, tmp_path: Path) -> str:
    make = shutil.which("make")
    assert make is not None, "make is needed to set the project up"
    return subprocess.run(
        [make, "--dry-run", target, f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip


def test_the_demo_venv_gets_no_test_packages(tmp_path: Path) -> None:
    demo, test = _planned("demo", tmp_path), _planned("test", tmp_path)
    assert "-e environments/arithmetic/" in demo  # the example environments: the user's
    assert "tests/verifiers_envs" not in demo  # the test material: never `vfops env list`ed
    for package in ("vf_group", "vf_guess", "vf_tools", "vf_xml_math"):
        assert f"-e tests/verifiers_envs/{package}/" in test
