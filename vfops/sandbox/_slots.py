"""Limits on live sandbox containers: one per host, shared by every process, and one
across a fleet of workers where a caller sets it (a sweep: a Prefect global limit).

Host: ``VFOPS_SANDBOX_MAX_CONTAINERS`` slot files in the host's state folder; a
container holds one by an exclusive ``flock`` on it from before its start to after its
removal. The kernel drops a dead process's locks, so a killed eval never holds a slot.
A process that finds every slot taken waits for one (its rollouts wait, the host is not
oversubscribed).

Fleet: a :class:`FleetGate` set with :func:`fleet_gate_scope` (the sweep cell's flow
sets one backed by a Prefect global concurrency limit, ``vfops.orchestration``); each
container then also holds one of its slots, taken after the host's and given back
after the container is removed. The sandbox knows nothing of Prefect: the gate is a
seam.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, Final, Protocol

from vfops.sandbox._owners import state_dir
from vfops.sandbox._settings import max_containers

_POLL_S: Final = 0.05
"""How often a process waiting for a slot looks again (another process's unlock is not
an event this one can wait on)."""


class FleetGate(Protocol):
    """A limit across machines: one slot per live container."""

    async def acquire(self) -> Any:
        """Wait for a slot; what :meth:`release` needs to give it back."""
        ...

    async def release(self, held: Any) -> None: ...


_GATE: ContextVar[FleetGate | None] = ContextVar("vfops_sandbox_fleet_gate", default=None)


@contextlib.contextmanager
def fleet_gate_scope(gate: FleetGate | None) -> Iterator[None]:
    """Containers started in this context also hold a slot of ``gate``."""
    token = _GATE.set(gate)
    try:
        yield
    finally:
        _GATE.reset(token)


class Slot:
    """One held slot (the host's, and the fleet's when a gate is set); :meth:`release`
    gives them back."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd
        self._gate: FleetGate | None = None
        self._held: Any = None

    async def release(self) -> None:
        gate, self._gate = self._gate, None
        try:
            if gate is not None:
                await gate.release(self._held)
        finally:
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
    """A slot, waiting while the host (then the fleet, when a gate is set) is at its
    limit."""
    # another process's unlock is no event this one can await: a short poll
    while (slot := try_slot(limit)) is None:  # noqa: ASYNC110
        await asyncio.sleep(_POLL_S)
    gate = _GATE.get()
    if gate is not None:
        try:
            slot._held = await gate.acquire()
        except BaseException:
            await slot.release()
            raise
        slot._gate = gate
    return slot
