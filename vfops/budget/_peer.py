"""Adaptive concurrency shared across processes: pushbacks through the registry.

Processes on any machines that call one endpoint share its limit, so what one
learns from a 429 concerns all of them. :class:`PeerSync` ties a process's
:class:`~vfops.budget.AdaptiveLimiter` to the registry's ``endpoint_pushback``
counter: when the limiter backs off on its own answers, it increments the
endpoint's epoch; when it sees the epoch moved by another process, it backs off
too (:meth:`AdaptiveLimiter.peer_decrease`). Decreases are synchronised and each
process probes upward on its own, which is how TCP flows sharing a link converge to
fair shares of it (Chiu & Jain 1989). A look costs one small query every
``interval_s``; a registry that does not answer only delays the news.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from vfops.budget._adaptive import AdaptiveLimiter

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

T = TypeVar("T")
log = logging.getLogger("vfops.budget")

PEER_SYNC_S = 0.5
"""How often a process looks at (and tells) its endpoints' pushbacks."""


class RegistryCalls(Protocol):
    """Runs ``fn(engine, *args)`` on the registry (an evaluation's registry calls)."""

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...


class PeerSync:
    """Shares ``limiter``'s pushbacks on endpoint ``limiter.name`` with other processes."""

    def __init__(
        self, limiter: AdaptiveLimiter, calls: RegistryCalls, *, interval_s: float = PEER_SYNC_S
    ) -> None:
        if not limiter.name:
            raise ValueError("PeerSync needs a limiter named after its endpoint")
        self.limiter, self.calls, self.interval_s = limiter, calls, interval_s
        self.endpoint = limiter.name
        self._seen = 0
        self._told = 0
        self._task: asyncio.Task[None] | None = None
        self.told = 0
        """Pushbacks this process reported."""
        self.heard = 0
        """Pushbacks of other processes seen (each one decrease, when busy)."""

    async def start(self) -> None:
        """Take the endpoint's current epoch as the baseline (earlier pushbacks are old
        news), then look every ``interval_s``."""
        self._seen = await self.calls.call(_epoch, self.endpoint)
        self._told = self.limiter.own_decreases
        self._task = asyncio.create_task(self._run(), name=f"peer-sync {self.endpoint}")

    async def step(self) -> None:
        """One look: tell a pushback of ours, or back off on one of theirs."""
        own = self.limiter.own_decreases
        if own > self._told:
            self._told = own
            self._seen = await self.calls.call(_bump, self.endpoint)
            self.told += 1
            return
        epoch = await self.calls.call(_epoch, self.endpoint)
        if epoch > self._seen:
            self._seen = epoch
            self.heard += 1
            self.limiter.peer_decrease()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.step()
            except Exception as exc:  # the registry did not answer: look again later
                log.debug("peer sync of %s: %s", self.endpoint, exc)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


_RUNNING: dict[int, tuple[PeerSync, int]] = {}


@contextlib.asynccontextmanager
async def peer_sync(limiter: AdaptiveLimiter, calls: RegistryCalls) -> AsyncIterator[PeerSync]:
    """The process's one :class:`PeerSync` of ``limiter`` while inside (evaluations that
    share a limiter, e.g. a sweep's cells, share its sync: one report per pushback)."""
    key = id(limiter)
    running = _RUNNING.get(key)
    # registered before any await: evaluations entering meanwhile share this one
    sync, refs = running if running is not None else (PeerSync(limiter, calls), 0)
    _RUNNING[key] = (sync, refs + 1)
    try:
        if running is None:
            await sync.start()
        yield sync
    finally:
        sync, refs = _RUNNING[key]
        if refs <= 1:
            del _RUNNING[key]
            await sync.aclose()
        else:
            _RUNNING[key] = (sync, refs - 1)


def _bump(engine: Engine, endpoint: str) -> int:
    from vfops.registry import bump_pushback, session_scope

    with session_scope(engine) as session:
        return bump_pushback(session, endpoint)


def _epoch(engine: Engine, endpoint: str) -> int:
    from vfops.registry import pushback_epoch, session_scope

    with session_scope(engine, write=False) as session:
        return pushback_epoch(session, endpoint)
