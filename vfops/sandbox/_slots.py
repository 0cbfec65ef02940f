"""A host-wide limit on live sandbox containers, shared by every process.

``VFOPS_SANDBOX_MAX_CONTAINERS`` slot files in the host's state folder; a container
holds one by an exclusive ``flock`` on it from before its start to after its removal.
The kernel drops a dead process's locks, so a killed eval never holds a slot. A process
that finds every slot taken waits for one (its rollouts wait, the host is not
oversubscribed); sweeps add a Prefect concurrency limit across machines on top.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from typing import Final

from vfops.sandbox._limits import max_containers
from vfops.sandbox._owners import state_dir

_POLL_S: Final = 0.05
"""How often a process waiting for a slot looks again (another process's unlock is not
an event this one can wait on)."""


class Slot:
    """One held slot; :meth:`release` gives it back."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None


def try_slot(limit: int | None = None) -> Slot | None:
    """A free slot, or None when all ``limit`` are held."""
    limit = max_containers() if limit is None else limit
    folder = state_dir() / "slots"
    folder.mkdir(parents=True, exist_ok=True)
    start = os.getpid() % limit  # processes start looking at different slots
    for k in range(limit):
        fd = os.open(folder / f"slot-{(start + k) % limit}", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return Slot(fd)
    return None


async def acquire_slot(limit: int | None = None) -> Slot:
    """A slot, waiting while the host is at its limit."""
    # another process's unlock is no event this one can await: a short poll
    while (slot := try_slot(limit)) is None:  # noqa: ASYNC110
        await asyncio.sleep(_POLL_S)
    return slot
