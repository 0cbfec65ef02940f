"""The processes below this one: become their subreaper (orphans, ``setsid`` daemons
included, come back to it instead of to init) and end them all. Linux only (elsewhere
a no-op): what a reward or an environment starts must not outlive what started it."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from typing import Final

__all__ = [
    "PR_SET_PDEATHSIG",
    "become_subreaper",
    "end_descendants",
    "prctl",
    "reap_any",
]

PR_SET_PDEATHSIG: Final = 1
_PR_SET_CHILD_SUBREAPER: Final = 36


def become_subreaper() -> None:
    """Orphans below this process are handed to it (a child subreaper)."""
    prctl(_PR_SET_CHILD_SUBREAPER, 1)


def prctl(option: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _ppids() -> dict[int, int]:
    """Every process's parent, from /proc."""
    found: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as file:
                stat = file.read()
        except OSError:
            continue  # ended meanwhile
        fields = stat[stat.rindex(b")") + 2 :].split()
        found[int(name)] = int(fields[1])
    return found


def _has_children() -> bool:
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def end_descendants(spare: frozenset[int] = frozenset()) -> None:
    """Kill every process below this one (a subreaper: orphans come back to it) except
    ``spare`` and theirs, and reap them. Cheap when there is none (one ``waitid``)."""
    me = os.getpid()
    for _ in range(1000):  # a process that forks as fast as it is killed: give up
        if not _has_children():
            return
        parents = _ppids()
        below: list[int] = []
        frontier = {me}
        while frontier:
            found = [pid for pid, ppid in parents.items() if ppid in frontier and pid not in spare]
            below.extend(found)
            frontier = set(found)
        direct = [pid for pid in below if parents.get(pid) == me]
        for pid in below:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not direct:
            reap_any()  # zombies (exited children) only
            if spare:
                return
            continue
        for pid in direct:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def reap_any() -> list[int]:
    reaped: list[int] = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append(pid)
