"""Detached service processes: start in a session of their own, find, stop.

Every process the stack starts carries ``VFOPS_STACK_ID`` (and ``VFOPS_STACK_SERVICE``)
in its environment, and everything it starts inherits them. A flow run may leave its
worker's process group (Prefect's workspace launcher starts each in a new session; a
flow run may start processes of its own), so stopping a service takes its process
group, its descendants and every process that carries its marker.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from vfops._errors import MissingExtraError

if TYPE_CHECKING:
    from psutil import Process

STACK_ID_VAR = "VFOPS_STACK_ID"
SERVICE_VAR = "VFOPS_STACK_SERVICE"

# Python ignores SIGPIPE and a parent may ignore the others (nohup): a service must
# get the default actions, or SIGTERM would not stop it and a closed pipe would not
# end it. (subprocess.Popen's restore_signals does the same for SIGPIPE/SIGXFSZ.)
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def psutil_module() -> ModuleType:
    try:
        import psutil
    except ModuleNotFoundError:
        raise MissingExtraError("stack", "psutil") from None
    return psutil


def spawn(argv: Sequence[str], env: Mapping[str, str], log: Path, cwd: Path) -> tuple[int, float]:
    """Start ``argv`` detached (a session of its own, stdin from /dev/null, stdout and
    stderr appended to ``log``); returns its pid and start time (the pid-reuse guard).

    posix_spawn rather than subprocess.Popen: the service outlives this process, and a
    Popen object of a running child warns (ResourceWarning) when it is collected.
    """
    psutil = psutil_module()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:  # the command (no secret: those travel in env only)
        out.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} started: {shlex.join(argv)}\n")
    # posix_spawn has no working-directory argument: the shell changes it and execs,
    # so the pid is the service's own
    shell = ["/bin/sh", "-c", 'cd "$0" && exec "$@"', str(cwd), *argv]
    pid = os.posix_spawn(
        "/bin/sh",
        shell,
        dict(env),
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
        setsigdef=_DEFAULT_SIGNALS,
    )
    try:
        started = start_time(pid)
    except psutil.NoSuchProcess:  # died at once: alive() reports it (start time unknown)
        started = 0.0
    return pid, started


_WALL_CLOCK_STARTS = 1e8
"""A recorded start above this many seconds is a wall-clock time (state files written
before starts were counted from boot): about three years of uptime."""


def start_time(pid: int) -> float:
    """When process ``pid`` started, in seconds since the machine booted: the pid-reuse
    guard of :func:`alive`. Raises ``psutil.NoSuchProcess`` when there is none.

    Counted from boot, not read from the wall clock: psutil's ``create_time()`` is the
    boot time + the start's clock ticks, and the boot time moves whenever the wall clock
    is stepped (NTP, a virtual machine resumed), so a stored wall-clock start time stops
    matching a process that never stopped (a whole stack read "not running" after a
    30 s step). Linux counts the ticks in ``/proc/PID/stat``; elsewhere psutil's
    wall-clock time is the guard.
    """
    psutil = psutil_module()
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        if not os.path.exists("/proc/self/stat"):  # no procfs: not Linux
            return float(psutil.Process(pid).create_time())
        raise psutil.NoSuchProcess(pid) from None
    # field 22 of proc_pid_stat(5), the 20th after the command's closing parenthesis
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


def reap(pid: int) -> int | None:
    """Collect ``pid`` if it is a child of this process that has exited; its exit code
    (negative: the signal), else None. A dead child left unreaped would look alive."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child (started by an earlier command): init reaps it
        return None
    if done == 0:
        return None
    return os.waitstatus_to_exitcode(status)


def alive(pid: int, started: float) -> bool:
    """Whether the process ``pid`` started at ``started`` still runs (not a reused pid)."""
    psutil = psutil_module()
    reap(pid)
    try:
        process = psutil.Process(pid)
        now = process.create_time() if started > _WALL_CLOCK_STARTS else start_time(pid)
        if started and abs(now - started) > 1.0:
            return False
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def marked_processes(stack_id: str, service: str | None = None) -> list[Process]:
    """Every process of this user whose environment carries the stack's marker (and
    ``service``'s, when given): flow runs in sessions of their own, orphans."""
    psutil = psutil_module()
    found = []
    me = os.getpid()
    for process in psutil.process_iter():
        if process.pid == me:
            continue
        try:
            env = process.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
        if env.get(STACK_ID_VAR) != stack_id:
            continue
        if service is not None and env.get(SERVICE_VAR) != service:
            continue
        found.append(process)
    return found


def service_processes(
    pid: int, started: float, stack_id: str, service: str | None
) -> list[Process]:
    """The service's process (if it is still the one started), its descendants, its
    process group and every process with its marker."""
    psutil = psutil_module()
    found: dict[int, Process] = {}
    if pid and alive(pid, started):
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(pid)
            found[root.pid] = root
            for child in root.children(recursive=True):
                found[child.pid] = child
            for process in psutil.process_iter():
                with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError, OSError):
                    if os.getpgid(process.pid) == pid:
                        found[process.pid] = process
    for process in marked_processes(stack_id, service):
        found[process.pid] = process
    found.pop(os.getpid(), None)
    return list(found.values())


def stop(processes: Iterable[Process], *, grace_s: float) -> int:
    """SIGTERM each process, SIGKILL what is left after ``grace_s`` (0: SIGKILL at once);
    returns how many were signalled."""
    psutil = psutil_module()
    targets = list(processes)
    first = signal.SIGKILL if grace_s <= 0 else signal.SIGTERM
    for process in targets:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            process.send_signal(first)
    _, left = psutil.wait_procs(targets, timeout=max(grace_s, 0.1))
    for process in left:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            process.kill()
    if left:
        psutil.wait_procs(left, timeout=10)
    for process in targets:  # our own children: no zombie left behind
        reap(process.pid)
    return len(targets)
