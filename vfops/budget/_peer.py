"""Adaptive concurrency shared across processes: pushbacks through the registry.

Processes on any machines that call one endpoint share its limit, so what one
learns from a 429 concerns all of them. :class:`PeerSync` ties a process's
:class:`~vfops.budget.AdaptiveLimiter` to the registry's ``endpoint_pushback``
counter: when the limiter backs off on its own answers, it increments the
endpoint's epoch (and records its limit); when it sees the epoch moved by another
process, it stops probing upward for a while (:meth:`AdaptiveLimiter.peer_pushback`),
so N processes do not probe the shared cap N times as fast; and a process joining
starts from a share of a peer's limit instead of no cap, skipping most of its
discovery burst. An evaluation installs it on its client as request middleware
(:class:`PeerSyncMiddleware`). A look costs one small query every ``interval_s``; a registry that
does not answer only delays the news.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from vfops._settings import DEFAULT_PEER_SYNC_S, peer_sync_s
from vfops.budget._adaptive import AdaptiveLimiter

if TYPE_CHECKING:
    from vfops.registry import RegistryService

log = logging.getLogger("vfops.budget")

HINT_TTL_S = 600.0
"""A peer's limit is a starting point for this long after its last pushback (a
provider's limit changes with its load: an older one is not news)."""
PEER_SYNC_S = DEFAULT_PEER_SYNC_S
"""How often a process looks at (and tells) its endpoints' pushbacks
(``VFOPS_PEER_SYNC_S`` for evaluations)."""


class PeerSync:
    """Shares ``limiter``'s pushbacks on endpoint ``limiter.name`` with other processes."""

    def __init__(
        self, limiter: AdaptiveLimiter, calls: RegistryService, *, interval_s: float = PEER_SYNC_S
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
        self.adopted = False
        """Whether the limiter started from a peer's limit."""

    async def start(self) -> None:
        """Take the endpoint's current epoch as the baseline (earlier pushbacks are old
        news) and, when a peer was pushed back lately (:data:`HINT_TTL_S`), start from its
        limit; then look every ``interval_s``."""
        epoch, hint, updated_at = await self.calls.call("pushback.state", self.endpoint)
        self._seen = epoch
        recent = updated_at is not None and time.time() - updated_at < HINT_TTL_S
        if hint is not None and recent:
            # half: a newcomer assumes the peer keeps the rest; its own 429s correct it
            self.adopted = self.limiter.adopt_peer_limit(hint / 2)
        self._told = self.limiter.own_decreases
        self._task = asyncio.create_task(self._run(), name=f"peer-sync {self.endpoint}")

    async def step(self) -> None:
        """One look: tell a pushback of ours, or back off on one of theirs."""
        own = self.limiter.own_decreases
        if own > self._told:
            self._told = own
            self._seen = await self.calls.call("pushback.bump", self.endpoint, self.limiter.limit)
            self.told += 1
            return
        epoch, _, _ = await self.calls.call("pushback.state", self.endpoint)
        if epoch > self._seen:
            self._seen = epoch
            self.heard += 1
            self.limiter.peer_pushback()

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


_RUNNING: dict[tuple[int, int], tuple[PeerSync, list[RegistryService]]] = {}
"""(limiter, event loop) -> its sync and the registry calls of the evaluations inside."""


@contextlib.asynccontextmanager
async def peer_sync(
    limiter: AdaptiveLimiter, calls: RegistryService
) -> AsyncIterator[PeerSync | None]:
    """The :class:`PeerSync` of ``limiter`` on this event loop while inside (evaluations
    that share a limiter on one loop, e.g. cells gathered together, share its sync: one
    report per pushback); ``None`` when ``VFOPS_PEER_SYNC_S=0`` turned sharing off.

    One per loop, not per process: a sweep runs cells in threads with loops of their
    own, and a sync's task must be awaited on the loop that made it. It looks through
    the calls of an evaluation still inside: each one's calls close when it ends.
    """
    interval = peer_sync_s()
    if interval == 0:  # sharing turned off
        yield None
        return
    key = (id(limiter), id(asyncio.get_running_loop()))
    running = _RUNNING.get(key)
    first = running is None
    # registered before any await: evaluations entering meanwhile share this one
    if running is None:
        sync, users = PeerSync(limiter, calls, interval_s=interval), [calls]
        _RUNNING[key] = (sync, users)
    else:
        sync, users = running
        users.append(calls)
    try:
        if first:
            await sync.start()
        yield sync
    finally:
        users.remove(calls)
        if users:
            sync.calls = users[-1]  # this evaluation's calls are about to close
        else:
            del _RUNNING[key]
            await sync.aclose()


class PeerSyncMiddleware:
    """:func:`peer_sync` as request middleware (:mod:`vfops.clients._middleware`): the
    sync runs while it is installed on the client; it does nothing per request (the
    limiter, entered around each attempt, already counts the pushbacks it tells)."""

    def __init__(self, limiter: AdaptiveLimiter, calls: RegistryService) -> None:
        self.limiter, self.calls = limiter, calls
        self.sync: PeerSync | None = None
        self._scope: contextlib.AbstractAsyncContextManager[PeerSync | None] | None = None

    def wrap(self, send: Callable[..., Any]) -> Callable[..., Any]:
        return send

    async def __aenter__(self) -> PeerSyncMiddleware:
        self._scope = peer_sync(self.limiter, self.calls)
        self.sync = await self._scope.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        scope, self._scope = self._scope, None
        if scope is not None:
            await scope.__aexit__(*exc)
