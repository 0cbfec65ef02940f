"""The tracker's life bound to its evaluation's, and the run folder fenced while it lives.

A ``kill -9`` of ``vfops eval`` used to leave its tracker running on: it worked
through the commands still in its pipe (appending to ``rollouts.arrow``, serving the
dead evaluation's registry calls) and then ended the MLflow run ``KILLED``, while an
immediate ``--resume`` was already writing the same files and the same MLflow run.
Three things make that impossible:

* the tracker learns at once that its parent died (Linux's ``PR_SET_PDEATHSIG``,
  set by the tracker itself, and a thread watching ``getppid`` as a fallback) and
  then runs no further command (:class:`Lifeline`);
* while it works on a run folder it holds an ``flock`` on ``RUN_DIR/.tracker.lock``
  (:func:`hold_run_folder`), released by the kernel when it exits, however it
  exits; whoever opens the run next waits for that lock first
  (:func:`wait_for_tracker`), so the old tracker's last write is done before the new
  holder's first;
* what it writes to MLflow at the end is fenced by the run's holder tag
  (:data:`HOLDER_TAG`, see :mod:`vfops.tracking._eval_runs`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Final

from vfops._errors import VfopsError

HOLDER_TAG: Final = "vfops.holder"
"""The MLflow run's tag naming the lease owner (:class:`vfops._lease.LeaseOwner`) of the
evaluation that holds the run; each holder writes it when it opens or resumes the run,
and a tracker ends the run only while it names its own evaluation."""

TRACKER_LOCK: Final = ".tracker.lock"
"""The file in a run folder whose ``flock`` the tracker working on that run holds."""

PARENT_GONE_SIGNAL: Final = signal.SIGUSR1
"""What the kernel sends the tracker when the evaluation that started it dies."""

_PR_SET_PDEATHSIG: Final = 1
_WATCH_EVERY_S: Final = 0.5
_POLL_S: Final = 0.02


def tracker_exit_wait_s() -> float:
    """How long a run's next holder waits for a dead holder's tracker to exit
    (``VFOPS_TRACKER_EXIT_WAIT_S``, default 60 s: it normally takes well under one)."""
    raw = os.environ.get("VFOPS_TRACKER_EXIT_WAIT_S", "").strip()
    try:
        value = float(raw) if raw else 60.0
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise VfopsError(
            f"VFOPS_TRACKER_EXIT_WAIT_S={raw!r} is not a number of seconds; set it to one "
            "(e.g. 60) or unset it"
        )
    return value


class TrackerStillRunning(VfopsError):
    """The tracker of a run's previous holder did not exit in time."""

    exit_code = 4  # the run is busy, not bad input


class RunTakenOver(VfopsError):
    """Another process holds the run now (its MLflow run's :data:`HOLDER_TAG` names
    it): this one writes nothing more there."""

    exit_code = 4  # as a lost lease

    def __init__(self, run: str, holder: str) -> None:
        super().__init__(
            f"another process ({holder}) took run {run} over; this one recorded nothing "
            "more in MLflow (let that process finish it)"
        )
        self.holder = holder


class Lifeline:
    """The tracker's view of its parent (the evaluation): :meth:`gone` once it died.

    The kernel signals the tracker when its parent dies (``PR_SET_PDEATHSIG``, asked
    for here, in the child: no ``preexec_fn`` in the parent, which has threads); a
    thread checks ``getppid`` every half second in case the signal cannot be had
    (another OS, a seccomp filter). A signal that comes because the parent's spawning
    thread ended while the parent lives is ignored: the parent's pid is checked."""

    def __init__(self, parent_pid: int) -> None:
        self._parent = parent_pid
        self._gone = threading.Event()
        if threading.current_thread() is threading.main_thread():
            signal.signal(PARENT_GONE_SIGNAL, self._on_signal)
            _ask_death_signal(PARENT_GONE_SIGNAL)
        self._check()  # it may have died before the signal was asked for
        watch = threading.Thread(target=self._watch, name="vfops-tracker-lifeline", daemon=True)
        watch.start()

    def gone(self) -> bool:
        """The evaluation that started this process is dead."""
        return self._gone.is_set()

    def _on_signal(self, signum: int, frame: object) -> None:
        self._check()

    def _check(self) -> None:
        if os.getppid() != self._parent:
            self._gone.set()

    def _watch(self) -> None:
        while not self._gone.wait(_WATCH_EVERY_S):
            self._check()


def _ask_death_signal(signum: int) -> None:
    """``prctl(PR_SET_PDEATHSIG, signum)`` where there is one (Linux); else nothing (the
    watching thread alone tells)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import ctypes.util

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)


def hold_run_folder(run_dir: Path) -> int:
    """Take ``RUN_DIR/.tracker.lock`` for this process's life (waits while another
    tracker holds it: the next holder waited for it already, so that is the moment a
    dying tracker needs to let go) and write this process's pid in it; returns the
    descriptor (closing it, or exiting, releases the lock)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / TRACKER_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def wait_for_tracker(run_dir: Path, timeout_s: float | None = None) -> None:
    """Return once no tracker works on ``run_dir`` (that of a killed evaluation exits
    within a second of it); raise :class:`TrackerStillRunning`, naming its pid, after
    ``timeout_s`` (default :func:`tracker_exit_wait_s`).

    Call it where a run is opened, once the run folder's own lock is held and before
    anything of the run is read or written: the dead holder's tracker may still be
    finishing a write (the Arrow export, a registry call it serves, the MLflow run)."""
    path = run_dir / TRACKER_LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return  # no tracker ever worked here
    try:
        wait_s = tracker_exit_wait_s() if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return  # free: closing the descriptor below lets go at once
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(_POLL_S)
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
    finally:
        os.close(fd)
    raise TrackerStillRunning(
        f"run folder {run_dir} is still being written by the MLflow tracker of an earlier "
        f"evaluation (pid {pid}), which did not exit within {wait_s:g} s of it; end it "
        f"(kill {pid}), then resume (or wait longer: VFOPS_TRACKER_EXIT_WAIT_S)"
    )
