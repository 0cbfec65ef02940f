"""vfops._on_demand: a package's ``__init__`` only when one of its names is asked for, and
entry points read once; what the tracker's start-up gains from them. Each case runs in
a fresh interpreter: both change the process's import state."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

_COUNT_SCANS = """
import importlib.metadata as metadata
scans = []  # one per read of the installed distributions
original = metadata.distributions
def distributions(**kw):
    scans.append(1)
    return original(**kw)
metadata.distributions = distributions
"""


def _run(code: str, cwd: Path, *, stream: str = "stdout", **env: str) -> list[str]:
    """The lines ``code`` writes to ``stream`` in a fresh interpreter, after
    ``_COUNT_SCANS`` (``scans`` counts its reads of the installed distributions)."""
    done = subprocess.run(
        [sys.executable, "-c", _COUNT_SCANS + textwrap.dedent(code)],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(cwd), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return str(getattr(done, stream)).splitlines()


def _package(root: Path) -> None:
    """``heavy``: its __init__ records that it ran and re-exports ``Light`` from
    ``heavy.light``; ``heavy.sub`` is a subpackage with its own __init__."""
    (root / "heavy" / "sub").mkdir(parents=True)
    (root / "heavy" / "__init__.py").write_text(
        "import builtins\n"
        "builtins.RAN = getattr(builtins, 'RAN', []) + ['heavy']\n"
        "from heavy.light import Light\n"
        "__version__ = '1.2'\n"
        "def everything(): return 'all'\n"
    )
    (root / "heavy" / "light.py").write_text("class Light:\n    pass\n")
    (root / "heavy" / "sub" / "__init__.py").write_text(
        "import builtins\n"
        "builtins.RAN = getattr(builtins, 'RAN', []) + ['sub']\n"
        "from heavy.sub.part import Part\n"
    )
    (root / "heavy" / "sub" / "part.py").write_text("class Part:\n    pass\n")


def test_a_served_name_comes_from_its_module_and_any_other_runs_the_init(tmp_path: Path) -> None:
    _package(tmp_path)
    out = _run(
        """
        import builtins, sys
        from vfops._on_demand import on_demand
        print(on_demand("heavy"), on_demand("heavy.sub", served={"Part": "part"}))
        from heavy.sub import Part
        import heavy.light
        print(getattr(builtins, "RAN", []), Part.__module__)
        print(heavy.__version__, getattr(builtins, "RAN", []))
        from heavy import Light, everything
        import heavy.sub as sub
        print(Light is heavy.light.Light, everything(), sub.Part is Part)
        print(sub.__dict__.get("Part") is None, getattr(sub, "missing", "absent"))
        print(on_demand("heavy"), on_demand("not_installed_anywhere"))
        """,
        tmp_path,
    )
    assert out == [
        "True True",
        "[] heavy.sub.part",  # neither __init__ ran; the served name is the module's class
        "1.2 ['heavy']",  # a dunder name is one of the package's own: its __init__ ran
        "True all True",
        "True absent",  # heavy.sub's __init__ has not run: Part was served, not set
        "False False",  # imported already; not installed: nothing changed
    ]


def test_entry_points_are_read_once_and_select_as_before(tmp_path: Path) -> None:
    out = _run(
        """
        import importlib.metadata as metadata
        groups = ("console_scripts", "vfops.environments", "mlflow.app")
        before = [sorted(map(str, metadata.entry_points(group=g))) for g in groups]
        scans.clear()
        from vfops._on_demand import cache_entry_points
        cache_entry_points()
        cache_entry_points()
        after = [sorted(map(str, metadata.entry_points(group=g))) for g in groups]
        again = [sorted(map(str, metadata.entry_points(group=g))) for g in groups]
        everything = metadata.entry_points()
        print(before == after == again, all(before), len(scans))
        print(sorted(map(str, everything.select(group=groups[1]))) == before[1])
        """,
        tmp_path,
    )
    assert out == ["True True 1", "True"]


def test_the_tracker_starts_without_fastapi_and_scans_entry_points_once(tmp_path: Path) -> None:
    """MLflow's start-up in the tracker process: fastapi's application and routing are not
    imported (MLflow's gateway gets its one exception class, the same class), the installed
    distributions are scanned for entry points once, and the store answers. (The tracker's
    stdout is its protocol's: the verdict goes to stderr.)"""
    err = _run(
        """
        import sys
        import vfops.tracking._tracker_main
        from vfops.tracking import check_tracking, prepare_experiment
        check_tracking()
        prepare_experiment("arithmetic")
        import vfops.tracking._eval_runs, vfops.tracking._trace_batch
        from fastapi import HTTPException
        from mlflow.gateway.utils import HTTPException as Gateways
        print("fastapi.routing" in sys.modules, len(scans), HTTPException is Gateways,
              file=sys.stderr)
        """,
        tmp_path,
        stream="stderr",
        VFOPS_HOME=str(tmp_path / "home"),
    )
    assert err[-1] == "False 1 True"
