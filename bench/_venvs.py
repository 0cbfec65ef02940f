"""Competitor tools live in their own git-ignored virtualenvs under ``.bench/``.

Each is created once and cached by a stamp of what was installed; a changed stamp
reinstalls. Shared by the benchmarks that compare vfops with another tool.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def ensure_venv(venv: Path, installs: Sequence[Sequence[str]], stamp: str, label: str) -> Path:
    """``venv`` with ``pip install`` of each argument list, in order; returns its python.

    Order matters: e.g. the CPU torch must come before anything that depends on it.
    """
    python = venv / "bin" / "python"
    stamp_file = venv / ".bench-stamp"
    if stamp_file.exists() and stamp_file.read_text() == stamp and python.exists():
        return python
    print(f"setting up {venv} ({label}) ...", flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    if not python.exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
    for args in installs:
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *args], check=True)
    stamp_file.write_text(stamp)
    return python


def venv_versions(python: Path, packages: list[str]) -> dict[str, str]:
    """Installed versions of ``packages`` in the interpreter ``python`` ('-' if absent)."""
    code = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for p in sys.argv[1:]:\n"
        "    try: out[p] = m.version(p)\n"
        "    except m.PackageNotFoundError: out[p] = '-'\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [str(python), "-c", code, *packages], capture_output=True, text=True, check=True
    )
    data: dict[str, str] = json.loads(done.stdout)
    return data


def ensure_target(
    python: Path, target: Path, installs: Sequence[Sequence[str]], stamp: str, label: str
) -> Path:
    """``pip install --no-deps --target target`` of each argument list with ``python``'s pip
    (its environment is left as it is); returns ``target``, for a ``PYTHONPATH``.

    ``importlib.metadata`` finds the installed ``.dist-info`` on ``sys.path``, so a
    process with ``target`` on its ``PYTHONPATH`` sees the packages as installed.
    """
    stamp_file = target / ".bench-stamp"
    if stamp_file.exists() and stamp_file.read_text() == stamp:
        return target
    print(f"setting up {target} ({label}) ...", flush=True)
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    for args in installs:
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
             "--target", str(target), *args],
            check=True,
        )  # fmt: skip
    stamp_file.write_text(stamp)
    return target
