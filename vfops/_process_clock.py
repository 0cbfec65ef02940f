"""How long this process has run: what a user waited for, from its start.

A command's own timers start when its work starts (an evaluation's rollout phase),
after the interpreter, the imports and the environment's load, and stop before the
recording of the run ends. The time a user waited is the process's, read from the
kernel's record of when it started: on Linux its start in clock ticks since boot
(``/proc/self/stat``, field 22) against the boot-time clock (both count from boot, so a
stepped wall clock changes nothing); elsewhere psutil's creation time against the wall
clock, when psutil is there; else the first import of this module (the label says so).
"""

from __future__ import annotations

import os
import time
from typing import Final

__all__ = ["process_age_s", "process_age_source"]

_IMPORTED: Final = time.monotonic()


def _linux_start_s() -> float | None:
    """Seconds since boot at which this process started, or None without procfs."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    # field 22 of proc_pid_stat(5), the 20th after the command's closing parenthesis
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


def process_age_source() -> str:
    """Where :func:`process_age_s` counts from: ``"process start"``, or ``"vfops import"``
    on a system that tells neither (no procfs, no psutil)."""
    if _linux_start_s() is not None and hasattr(time, "CLOCK_BOOTTIME"):
        return "process start"
    try:
        import psutil  # noqa: F401
    except ImportError:
        return "vfops import"
    return "process start"


def process_age_s() -> float:
    """Seconds since this process started (clock-tick resolution: 10 ms on Linux)."""
    started = _linux_start_s()
    if started is not None and hasattr(time, "CLOCK_BOOTTIME"):
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    try:
        import psutil
    except ImportError:
        return time.monotonic() - _IMPORTED
    return max(0.0, time.time() - psutil.Process().create_time())
