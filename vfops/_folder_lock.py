"""The run folder's lock: one process works on a run folder at a time.

``fcntl.flock`` on ``RUN_DIR/.lock``: the kernel releases it when its holder dies
(even by kill -9), so a stale lock cannot outlive its process. It covers runs
without the registry; runs in the registry also hold a lease on their row
(:func:`vfops.registry.take_run_lease`), which works across machines.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from vfops._errors import VfopsError

LOCK_FILE = ".lock"


class RunFolderBusyError(VfopsError):
    """Another process holds the run folder's lock."""

    exit_code = 4  # as vfops.registry.RunBusyError: the run is busy, not bad input


class RunFolderLock:
    """Held from :meth:`acquire` until :meth:`release` (or the process's end)."""

    def __init__(self, run_dir: Path) -> None:
        self._path = run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock now, or raise :class:`RunFolderBusyError` naming its holder."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunFolderBusyError(
                f"run folder {self._path.parent} is being worked on by {holder}; wait for "
                "it to end (its lock goes with it), then resume"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        # the file stays: removing it would let a waiter lock a file nobody else sees
        if self._fd is not None:
            os.close(self._fd)  # closing releases the flock
            self._fd = None
