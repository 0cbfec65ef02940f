"""The stack's process guard: a service is recognised by its pid and start time, and
a step of the wall clock (NTP, a virtual machine resumed) does not make it look dead."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from vfops.stack._process import alive, spawn, stop


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[tuple[int, float]]:
    pid, started = spawn(
        [sys.executable, "-c", "import time; time.sleep(300)"], {}, tmp_path / "log", tmp_path
    )
    yield pid, started
    stop([psutil.Process(pid)] if psutil.pid_exists(pid) else [], grace_s=0)


def test_a_service_stays_alive_across_a_wall_clock_step(
    sleeper: tuple[int, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    pid, started = sleeper
    assert alive(pid, started)
    import psutil._pslinux as linux  # Linux: the platform the stack runs on

    booted = linux.boot_time()
    # the wall clock jumps 30 s ahead: psutil's boot time (now - uptime) moves with it
    monkeypatch.setattr(linux, "boot_time", lambda: booted + 30.0)
    assert abs(psutil.Process(pid).create_time() - booted - 30.0 - started) < 1.0  # it moved
    assert alive(pid, started)
    assert not alive(pid, started + 5.0)  # another process that reused the pid
    stop([psutil.Process(pid)], grace_s=0)
    assert not alive(pid, started)


def test_a_state_file_of_wall_clock_start_times_is_still_read(
    sleeper: tuple[int, float],
) -> None:
    pid, _ = sleeper
    assert alive(pid, psutil.Process(pid).create_time())  # written by an earlier vfops
    assert not alive(pid, psutil.Process(pid).create_time() - 10.0)
