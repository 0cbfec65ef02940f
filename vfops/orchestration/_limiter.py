"""The request limiter over a budget's Prefect global limits, shared by every worker.

:class:`PrefectRequestLimiter` is a :class:`vfops.clients.RequestLimiter`; the budget
package keeps the limiters that need no Prefect (local, adaptive, peer-synced). Prefect
is imported inside the methods: ``import vfops`` never imports it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from vfops._errors import InvalidArgumentError, VfopsError
from vfops.budget import (
    LoopLocalLock,
    Pacer,
    check_budget_values,
    rate_limit_batch,
    rate_limit_name,
)
from vfops.orchestration._limits import ensure_limits, read_rate_limit
from vfops.orchestration._pools import prefect_client

DEFAULT_LEASE_DURATION_S = 60.0
"""Lease of a concurrency slot (Prefect's minimum); renewed while the request runs."""
DEFAULT_ACQUIRE_TIMEOUT_S = 600.0
"""How long a request waits for its budget before failing with a TimeoutError."""


async def prefect_limiter(
    name: str,
    *,
    max_concurrent: int | None,
    requests_per_s: float | None,
    concurrency_slots: int | None = None,
    acquire_timeout_s: float | None = DEFAULT_ACQUIRE_TIMEOUT_S,
) -> PrefectRequestLimiter | None:
    """:func:`ensure_limits`, then a limiter over whichever of budget ``name``'s
    limits exist and are active on the server (also ones made elsewhere, e.g. with
    ``prefect gcl create``); ``None`` when there are none. ``concurrency_slots``:
    see :class:`PrefectRequestLimiter` (this process leases that many slots)."""
    from prefect.exceptions import ObjectNotFound

    await ensure_limits(name, max_concurrent=max_concurrent, requests_per_s=requests_per_s)
    active: dict[str, bool] = {}
    async with prefect_client() as client:
        for limit in (name, rate_limit_name(name)):
            try:
                found = await client.read_global_concurrency_limit_by_name(limit)
            except ObjectNotFound:
                active[limit] = False
            else:
                active[limit] = found.active and found.limit > 0
                if limit != name and found.slot_decay_per_second <= 0:
                    active[limit] = False
    rate, concurrency = active[rate_limit_name(name)], active[name]
    if not rate and not concurrency:
        return None
    return PrefectRequestLimiter(
        name,
        rate=rate,
        concurrency=concurrency,
        concurrency_slots=concurrency_slots if concurrency else None,
        requests_per_s=requests_per_s if rate else None,
        acquire_timeout_s=acquire_timeout_s,
    )


class PrefectRequestLimiter:
    """A :class:`vfops.clients.RequestLimiter` backed by budget ``name``'s Prefect
    global limits, so every worker of every flow shares them.

    **Rate** (``rate=True``): each request attempt waits for its turn in the rate
    limit ``name-rate``. Slots are taken from the server a batch at a time (the
    limit's ``limit``, about one second of requests) and spent locally, evenly
    spaced, at ``requests_per_s`` (default: the server's ``slot_decay_per_second``).
    Taking one slot per request instead loses most of the rate: Prefect decays
    whole slots only and every attempt, granted or denied, restarts the decay
    clock (measured: ~40 % of the configured rate).

    **Concurrency** (``concurrency=True``) on the limit ``name``, in one of two modes:

    - ``concurrency_slots=k``: this process leases ``k`` slots (capped at the
      limit) on its first request and admits up to ``k`` requests at once until
      :meth:`aclose`; the lease is renewed by Prefect while held, and expires
      ``lease_duration_s`` after a process dies, so slots never leak (#17415).
    - ``concurrency_slots=None``: each request attempt leases one slot. Exact, but
      three API calls and a renewal thread per request, serialised per process
      by Prefect (measured on a local server: ~1.5 s average wait at 8 in flight),
      so only for slow, expensive requests.

    Waiting longer than ``acquire_timeout_s`` for the budget raises a TimeoutError.
    Use one limiter per process and budget, inside one event loop, and close it
    (``async with limiter:`` or :meth:`aclose`).
    """

    def __init__(
        self,
        name: str,
        *,
        rate: bool = True,
        concurrency: bool = False,
        concurrency_slots: int | None = None,
        requests_per_s: float | None = None,
        acquire_timeout_s: float | None = DEFAULT_ACQUIRE_TIMEOUT_S,
        lease_duration_s: float = DEFAULT_LEASE_DURATION_S,
        strict: bool = True,
    ) -> None:
        if not rate and not concurrency:
            raise InvalidArgumentError("PrefectRequestLimiter needs rate=True or concurrency=True")
        check_budget_values(concurrency_slots, requests_per_s, where=f"limiter {name!r}")
        if lease_duration_s < 60:
            raise InvalidArgumentError("lease_duration_s must be at least 60 (Prefect's minimum)")
        self.name = name
        self.rate = rate
        self.concurrency = concurrency
        self.concurrency_slots = concurrency_slots
        self.requests_per_s = requests_per_s
        self.acquire_timeout_s = acquire_timeout_s
        self.lease_duration_s = lease_duration_s
        self.strict = strict
        self._pacer: Pacer | None = None
        self._init_lock = LoopLocalLock()
        self._holder: asyncio.Task[None] | None = None
        self._release: asyncio.Event | None = None
        self._held: asyncio.Semaphore | None = None
        self.held_slots = 0
        """Concurrency slots this process holds (``concurrency_slots`` mode)."""
        self.acquired = 0
        """How many request attempts were admitted."""

    def __repr__(self) -> str:
        return (
            f"PrefectRequestLimiter({self.name!r}, rate={self.rate}, "
            f"concurrency={self.concurrency}, concurrency_slots={self.concurrency_slots})"
        )

    async def _grant(self, slots: int) -> None:
        from prefect.concurrency.asyncio import rate_limit

        await rate_limit(
            rate_limit_name(self.name),
            occupy=slots,
            timeout_seconds=self.acquire_timeout_s,
            strict=self.strict,
        )

    async def _get_pacer(self) -> Pacer:
        if self._pacer is not None:
            return self._pacer
        async with self._init_lock.lock():  # concurrent first requests read the limit once
            if self._pacer is None:
                limit, server_rate = await read_rate_limit(self.name)
                # never run faster than the server's rate, nor take more than its limit
                requests_per_s = min(self.requests_per_s or server_rate, server_rate)
                batch = max(1, min(limit, rate_limit_batch(requests_per_s)))
                self._pacer = Pacer(requests_per_s, batch=batch, grant=self._grant)
        return self._pacer

    async def _hold(self, slots: int, ready: asyncio.Future[None], release: asyncio.Event) -> None:
        from prefect.concurrency.asyncio import concurrency

        try:
            async with concurrency(
                self.name,
                occupy=slots,
                timeout_seconds=self.acquire_timeout_s,
                lease_duration=self.lease_duration_s,
                strict=self.strict,
                raise_on_lease_renewal_failure=False,
            ):
                ready.set_result(None)
                await release.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
                return
            raise

    async def _held_semaphore(self) -> asyncio.Semaphore:
        if self._held is not None:
            return self._held
        async with self._init_lock.lock():
            if self._held is None:
                assert self.concurrency_slots is not None
                from prefect.exceptions import ObjectNotFound

                async with prefect_client() as client:
                    try:
                        found = await client.read_global_concurrency_limit_by_name(self.name)
                    except ObjectNotFound:
                        raise VfopsError(
                            f"no Prefect global concurrency limit {self.name!r}; create it with "
                            f"vfops.orchestration.ensure_limits({self.name!r}, max_concurrent=...)"
                        ) from None
                slots = max(1, min(self.concurrency_slots, found.limit))
                loop = asyncio.get_running_loop()
                ready: asyncio.Future[None] = loop.create_future()
                self._release = asyncio.Event()
                self._holder = loop.create_task(self._hold(slots, ready, self._release))
                await ready  # raises the acquisition error (e.g. TimeoutError)
                self.held_slots = slots
                self._held = asyncio.Semaphore(slots)
        assert self._held is not None
        return self._held

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[None]:
        if not self.concurrency:
            await (await self._get_pacer()).wait()
            self.acquired += 1
            yield
        elif self.concurrency_slots is not None:
            async with await self._held_semaphore():
                if self.rate:
                    await (await self._get_pacer()).wait()
                self.acquired += 1
                yield
        else:
            from prefect.concurrency.asyncio import concurrency

            async with concurrency(
                self.name,
                occupy=1,
                timeout_seconds=self.acquire_timeout_s,
                lease_duration=self.lease_duration_s,
                strict=self.strict,
                raise_on_lease_renewal_failure=False,
            ):
                if self.rate:
                    await (await self._get_pacer()).wait()
                self.acquired += 1
                yield

    async def aclose(self) -> None:
        """Release the concurrency slots this process holds (if any)."""
        holder, self._holder = self._holder, None
        if holder is not None:
            assert self._release is not None
            self._release.set()
            await holder
        self._held = self._release = None
        self.held_slots = 0

    async def __aenter__(self) -> PrefectRequestLimiter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
