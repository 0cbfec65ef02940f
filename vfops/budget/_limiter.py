"""In-process pacing: the part of a request budget that needs no server.

:class:`Pacer` spaces request starts at least ``1/requests_per_s`` apart and, when
given a ``grant`` callable, takes permission for ``batch`` requests at a time from
a shared limiter (Prefect's rate limit in :class:`vfops.orchestration.PrefectRequestLimiter`).
:class:`LocalRequestLimiter` is a pacer plus a semaphore, for one process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from vfops._errors import InvalidArgumentError
from vfops.budget._config import check_budget_values

Grant = Callable[[int], Awaitable[None]]
"""``grant(n)`` returns once ``n`` requests may start (e.g. Prefect's ``rate_limit``)."""

GRANT_SLACK_S = 0.01
"""Extra wait before asking for the next batch, so the shared limiter's slots have
surely decayed (Prefect decays whole slots only: ``floor(rate * elapsed)``)."""


class LoopLocalLock:
    """asyncio primitives belong to one event loop; rebuild them for a new loop."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None

    def lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._loop is not loop:
            self._lock, self._loop = asyncio.Lock(), loop
        return self._lock


class Pacer:
    """Admits callers one at a time (FIFO), at most ``requests_per_s`` per second.

    Consecutive admissions are at least ``1/requests_per_s`` apart, measured from
    the actual previous admission (a late wake-up never shortens the next gap), so
    any 1 s window holds at most ``ceil(requests_per_s)`` admissions from this
    pacer. With ``grant``, each batch of ``batch`` admissions first awaits
    ``grant(batch)``; the next batch is asked for no earlier than ``batch /
    requests_per_s`` after the previous grant, and unused permissions lapse then.
    """

    def __init__(
        self, requests_per_s: float, *, batch: int = 1, grant: Grant | None = None
    ) -> None:
        check_budget_values(None, requests_per_s, where="Pacer")
        if batch < 1:
            raise InvalidArgumentError(f"batch must be at least 1, got {batch}")
        self.requests_per_s = float(requests_per_s)
        self.interval = 1.0 / self.requests_per_s
        self.batch = batch
        self._grant = grant
        self._local = LoopLocalLock()
        self._tokens = 0
        self._tokens_expire = -float("inf")
        self._next_grant = -float("inf")
        self._next_start = -float("inf")
        self.grants = 0
        """How many times ``grant`` was awaited."""

    async def wait(self) -> None:
        """Return when the caller may start one request."""
        async with self._local.lock():
            now = time.monotonic()
            if self._grant is not None and (self._tokens <= 0 or now >= self._tokens_expire):
                if now < self._next_grant:
                    await asyncio.sleep(self._next_grant - now)
                await self._grant(self.batch)
                self.grants += 1
                now = time.monotonic()
                self._tokens = self.batch
                self._next_grant = self._tokens_expire = (
                    now + self.batch * self.interval + GRANT_SLACK_S
                )
            if now < self._next_start:
                await asyncio.sleep(self._next_start - now)
                now = time.monotonic()
            self._next_start = now + self.interval
            self._tokens -= 1


class LocalRequestLimiter:
    """A :class:`vfops.clients.RequestLimiter` for one process: at most
    ``max_concurrent`` requests in flight and ``requests_per_s`` starts per second
    (``None``: no limit of that kind)."""

    def __init__(
        self, *, max_concurrent: int | None = None, requests_per_s: float | None = None
    ) -> None:
        check_budget_values(max_concurrent, requests_per_s, where="LocalRequestLimiter")
        self.max_concurrent = max_concurrent
        self.requests_per_s = requests_per_s
        self._pacer = Pacer(requests_per_s) if requests_per_s is not None else None
        self._sem_loop: asyncio.AbstractEventLoop | None = None
        self._sem: asyncio.Semaphore | None = None
        self.acquired = 0
        """How many requests were admitted."""

    def _semaphore(self) -> asyncio.Semaphore | None:
        if self.max_concurrent is None:
            return None
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem_loop is not loop:
            self._sem, self._sem_loop = asyncio.Semaphore(self.max_concurrent), loop
        return self._sem

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[None]:
        semaphore = self._semaphore()
        if semaphore is not None:
            await semaphore.acquire()
        try:
            if self._pacer is not None:
                await self._pacer.wait()
            self.acquired += 1
            yield
        finally:
            if semaphore is not None:
                semaphore.release()
