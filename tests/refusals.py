"""Running a ``vfops`` refusal as a user does, and what it left behind: its stderr, the
processes its process tree started, the files it wrote (tests/test_eval_refusals.py and
tests/v1/test_v1_refusals.py).

Every Python process of the tree loads a ``sitecustomize`` put first on its
``PYTHONPATH`` that writes, to the file ``VFOPS_SPAWN_LOG`` names, one line for the process
itself and one for every process it starts (the interpreter's audit events for
``subprocess``, ``os.posix_spawn``, ``os.exec*``, ``os.fork`` and ``os.system``): a tracker
or registry child that started and was killed a moment later is still on record.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

_SPY = """\
import os, sys
_log = os.environ.get("VFOPS_SPAWN_LOG")
if _log:
    def _write(line):
        with open(_log, "a") as out:
            out.write(line + "\\n")
    _write(f"process {' '.join(sys.orig_argv)}")
    _SPAWNS = {"subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "os.forkpty",
               "os.system"}
    def _hook(event, args):
        if event in _SPAWNS:
            _write(f"spawn {event} {args[:2]!r}")
    sys.addaudithook(_hook)
"""


@dataclass
class Refusal:
    returncode: int
    stderr_lines: list[str]
    spawned: list[str]
    """What the command's processes started (see the module docstring)."""
    processes: list[str]
    """The Python processes of its tree, the command's own first."""
    written: list[str]
    """Paths under its VFOPS_HOME and its working folder afterwards (relative)."""


def run_refusal(vfops: str, args: list[str], tmp: Path, **env: str) -> Refusal:
    """``vfops ARGS`` in ``tmp/work`` with a fresh ``VFOPS_HOME`` (``tmp/home``), its
    registry and MLflow tracking on (the defaults a user has), ``env`` added."""
    spy = tmp / "spy"
    spy.mkdir()
    (spy / "sitecustomize.py").write_text(_SPY)
    home, work, log = tmp / "home", tmp / "work", tmp / "spawns.log"
    work.mkdir()
    python_path = os.pathsep.join(p for p in (str(spy), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [vfops, *args],
        cwd=work,
        env={
            **os.environ,
            "VFOPS_HOME": str(home),
            "VFOPS_TRACKING": "1",
            "VFOPS_SPAWN_LOG": str(log),
            "PYTHONPATH": python_path,
            **env,
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = log.read_text().splitlines() if log.exists() else []
    written = [
        str(path.relative_to(tmp))
        for folder in (home, work)
        if folder.exists()
        for path in sorted(folder.rglob("*"))
    ]
    return Refusal(
        returncode=done.returncode,
        stderr_lines=done.stderr.splitlines(),
        spawned=[line.removeprefix("spawn ") for line in lines if line.startswith("spawn ")],
        processes=[line.removeprefix("process ") for line in lines if line.startswith("process ")],
        written=written,
    )


def assert_refused(refusal: Refusal, *phrases: str, queries: tuple[str, ...] = ()) -> None:
    """Exit 2, one line on stderr holding every one of ``phrases`` (the problem and the
    fix), no process started by the command, nothing written. ``queries``: spawns allowed
    because the check itself is one (``podman image inspect``: is the image here?), each
    named by a fragment of its arguments; they start nothing that lasts."""
    assert refusal.returncode == 2, refusal
    (line,) = refusal.stderr_lines or [""]
    assert line.startswith("error: "), refusal.stderr_lines
    for phrase in phrases:
        assert phrase in line, (phrase, line)
    # the command itself ran with the spy (else the checks below would prove nothing)
    assert len(refusal.processes) == 1, refusal.processes
    started = [s for s in refusal.spawned if not any(query in s for query in queries)]
    assert started == [], started
    assert refusal.written == [], refusal.written
