"""Budgets as Prefect global concurrency limits, shared by every worker.

A budget named ``N`` (see :func:`vfops.budget.limit_name`) is up to two global
limits on the Prefect server:

- ``N``: a concurrency limit of ``max_concurrent`` slots; each request holds one
  slot while in flight, under a lease (``lease_duration_s``), so the slots of a
  process that dies come back when the lease expires instead of leaking (Prefect
  issue #17415);
- ``N-rate``: a rate limit of ``requests_per_s`` (``slot_decay_per_second``) with
  ``limit`` = about one second of requests. Rate-limit slots are never released:
  they decay, so nothing can hold them.

Prefect is imported inside the functions: ``import vfops`` never imports it.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vfops._errors import VfopsError
from vfops.budget._config import check_budget_values, rate_limit_batch, rate_limit_name
from vfops.budget._limiter import LoopLocalLock, Pacer

if TYPE_CHECKING:
    from prefect.client.orchestration import PrefectClient

DEFAULT_LEASE_DURATION_S = 60.0
"""Lease of a concurrency slot (Prefect's minimum); renewed while the request runs."""
DEFAULT_ACQUIRE_TIMEOUT_S = 600.0
"""How long a request waits for its budget before failing with a TimeoutError."""


@dataclass(frozen=True, slots=True)
class LimitsInfo:
    """What :func:`ensure_limits` left on the server (``None``: not managed)."""

    name: str
    concurrency_limit: str | None
    rate_limit: str | None
    max_concurrent: int | None
    requests_per_s: float | None


async def _upsert(
    client: PrefectClient, name: str, limit: int, slot_decay_per_second: float
) -> None:
    from prefect.client.schemas.actions import (
        GlobalConcurrencyLimitCreate,
        GlobalConcurrencyLimitUpdate,
    )
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    try:
        existing = await client.read_global_concurrency_limit_by_name(name)
    except ObjectNotFound:
        try:
            await client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(
                    name=name, limit=limit, slot_decay_per_second=slot_decay_per_second
                )
            )
            return
        except ObjectAlreadyExists:  # created meanwhile by another worker: update it
            existing = await client.read_global_concurrency_limit_by_name(name)
    if (
        existing.limit != limit
        or not math.isclose(existing.slot_decay_per_second, slot_decay_per_second)
        or not existing.active
    ):
        await client.update_global_concurrency_limit(
            name,
            GlobalConcurrencyLimitUpdate(
                limit=limit, slot_decay_per_second=slot_decay_per_second, active=True
            ),
        )


async def ensure_limits(
    name: str, *, max_concurrent: int | None, requests_per_s: float | None
) -> LimitsInfo:
    """Create or update the global limits of budget ``name`` (idempotent).

    ``max_concurrent`` sets the concurrency limit ``name``; ``requests_per_s`` the
    rate limit ``name-rate``. ``None`` leaves that limit as it is on the server
    (absent or configured elsewhere, e.g. ``prefect gcl create``).
    """
    check_budget_values(max_concurrent, requests_per_s, where=f"budget {name!r}")
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        if max_concurrent is not None:
            await _upsert(client, name, max_concurrent, 0.0)
        if requests_per_s is not None:
            await _upsert(
                client, rate_limit_name(name), rate_limit_batch(requests_per_s), requests_per_s
            )
    return LimitsInfo(
        name=name,
        concurrency_limit=name if max_concurrent is not None else None,
        rate_limit=rate_limit_name(name) if requests_per_s is not None else None,
        max_concurrent=max_concurrent,
        requests_per_s=requests_per_s,
    )


async def read_rate_limit(name: str) -> tuple[int, float]:
    """``(limit, requests_per_s)`` of the rate limit of budget ``name`` on the server."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    limit_name = rate_limit_name(name)
    async with get_client() as client:
        try:
            found = await client.read_global_concurrency_limit_by_name(limit_name)
        except ObjectNotFound:
            raise VfopsError(
                f"no Prefect global concurrency limit {limit_name!r}; create it with "
                f"vfops.budget.ensure_limits({name!r}, requests_per_s=...) or "
                f"`prefect gcl create {limit_name} --limit N --slot-decay-per-second R`"
            ) from None
    if found.slot_decay_per_second <= 0:
        raise VfopsError(
            f"Prefect global concurrency limit {limit_name!r} has no slot decay, so it is "
            "not a rate limit; set --slot-decay-per-second to the requests per second"
        )
    return found.limit, found.slot_decay_per_second


class PrefectRequestLimiter:
    """A :class:`vfops.clients.RequestLimiter` backed by budget ``name``'s Prefect
    global limits, so every worker of every flow shares it.

    Each request attempt first holds a slot of the concurrency limit ``name``
    (when ``concurrency``; a lease of ``lease_duration_s``, renewed by Prefect
    while the request runs) and then waits for its turn in the rate limit
    ``name-rate`` (when ``rate``). Rate slots are taken from the server a batch
    at a time (the limit's ``limit``, about one second of requests) and spent
    locally at ``requests_per_s``: with one slot per request, Prefect's
    whole-slot decay loses most of the rate. ``requests_per_s`` defaults to the
    server's ``slot_decay_per_second``. Waiting longer than ``acquire_timeout_s``
    raises a TimeoutError. Use one limiter per process and budget.
    """

    def __init__(
        self,
        name: str,
        *,
        rate: bool = True,
        concurrency: bool = True,
        requests_per_s: float | None = None,
        acquire_timeout_s: float | None = DEFAULT_ACQUIRE_TIMEOUT_S,
        lease_duration_s: float = DEFAULT_LEASE_DURATION_S,
        strict: bool = True,
    ) -> None:
        if not rate and not concurrency:
            raise ValueError("PrefectRequestLimiter needs rate=True or concurrency=True")
        check_budget_values(None, requests_per_s, where=f"PrefectRequestLimiter {name!r}")
        if lease_duration_s < 60:
            raise ValueError("lease_duration_s must be at least 60 (Prefect's minimum)")
        self.name = name
        self.rate = rate
        self.concurrency = concurrency
        self.requests_per_s = requests_per_s
        self.acquire_timeout_s = acquire_timeout_s
        self.lease_duration_s = lease_duration_s
        self.strict = strict
        self._pacer: Pacer | None = None
        self._init_lock = LoopLocalLock()
        self.acquired = 0
        """How many request attempts were admitted."""

    def __repr__(self) -> str:
        return (
            f"PrefectRequestLimiter({self.name!r}, rate={self.rate}, "
            f"concurrency={self.concurrency}, requests_per_s={self.requests_per_s})"
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
            if self._pacer is not None:
                return self._pacer
            limit, server_rate = await read_rate_limit(self.name)
            requests_per_s = self.requests_per_s or server_rate
            # never take more than the server allows at once, nor run faster than it
            requests_per_s = min(requests_per_s, server_rate)
            batch = min(limit, rate_limit_batch(requests_per_s))
            if batch < 1:
                raise VfopsError(
                    f"Prefect rate limit {rate_limit_name(self.name)!r} has limit {limit}; "
                    "it must be at least 1"
                )
            self._pacer = Pacer(requests_per_s, batch=batch, grant=self._grant)
        return self._pacer

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[None]:
        if self.concurrency:
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
        else:
            await (await self._get_pacer()).wait()
            self.acquired += 1
            yield
