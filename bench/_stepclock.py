"""Per-step clocks for ``bench/train_step.py``'s two sides (stdlib only: imported by both venvs).

A :class:`StepClock` reading has the wall clock, this process's CPU time (all
threads) and the machine's busy CPU time from ``/proc/stat``. The difference of
two readings gives the step's wall seconds, its own CPU seconds and the CPU
seconds other processes used meanwhile (busy - own), so a step slowed by
someone else's work on the shared 2-core machine shows up as such.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (NaN where /proc/stat is missing)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return float("nan")
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    values = [int(v) for v in fields[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = values
    return (user + nice + system + irq + softirq + steal) / _TICK


@dataclass(frozen=True, slots=True)
class Reading:
    wall: float
    cpu: float
    busy: float


def read() -> Reading:
    return Reading(time.perf_counter(), time.process_time(), _busy_s())


def delta(start: Reading, end: Reading) -> dict[str, float]:
    """``wall_s``, ``cpu_s`` (this process) and ``others_cpu_s`` (rest of the machine)."""
    cpu = end.cpu - start.cpu
    return {
        "wall_s": end.wall - start.wall,
        "cpu_s": cpu,
        "others_cpu_s": max(0.0, (end.busy - start.busy) - cpu),
    }
