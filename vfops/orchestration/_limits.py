"""Prefect global concurrency limits: ensured in one place, for budgets and GPUs alike.

A budget named ``N`` (see :func:`vfops.budget.limit_name`) is up to two global limits
on the Prefect server:

- ``N``: a concurrency limit of ``max_concurrent`` slots; each request holds one slot
  while in flight, under a lease, so the slots of a process that dies come back when
  the lease expires instead of leaking (Prefect issue #17415);
- ``N-rate``: a rate limit of ``requests_per_s`` (``slot_decay_per_second``) with
  ``limit`` = about one second of requests. Rate-limit slots are never released: they
  decay, so nothing can hold them.

Training's GPUs are a concurrency limit too (``gpu`` by default): :func:`gpu_slots`
holds ``gpus`` of its slots for a run. Every limit is made by :func:`ensure_limit`.
Prefect is imported inside the functions: ``import vfops`` never imports it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vfops._errors import VfopsError
from vfops.budget import check_budget_values, rate_limit_batch, rate_limit_name
from vfops.orchestration._pools import prefect_client

if TYPE_CHECKING:
    from prefect.client.orchestration import PrefectClient

GPU_LEASE_S = 600.0
"""Lease of a training run's GPU slots, renewed while it runs: a dead worker's slots
come back this long after it died."""


@dataclass(frozen=True, slots=True)
class LimitsInfo:
    """What :func:`ensure_limits` left on the server (``None``: not managed)."""

    name: str
    concurrency_limit: str | None
    rate_limit: str | None
    max_concurrent: int | None
    requests_per_s: float | None


async def ensure_limit(
    name: str,
    limit: int,
    *,
    slot_decay_per_second: float = 0.0,
    update: bool = True,
    client: PrefectClient | None = None,
) -> None:
    """Create the global concurrency limit ``name`` unless it exists (idempotent; a
    concurrent creator is no error). An existing limit is set to ``limit`` and
    ``slot_decay_per_second`` (and activated) with ``update``; without, it is left as an
    operator set it (e.g. ``prefect gcl create gpu --limit 8``)."""
    if client is None:
        async with prefect_client() as own:
            return await ensure_limit(
                name, limit, slot_decay_per_second=slot_decay_per_second, update=update,
                client=own,
            )  # fmt: skip
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
        except ObjectAlreadyExists:  # created meanwhile by another worker
            existing = await client.read_global_concurrency_limit_by_name(name)
    if update and (
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
    async with prefect_client() as client:
        if max_concurrent is not None:
            await ensure_limit(name, max_concurrent, client=client)
        if requests_per_s is not None:
            await ensure_limit(
                rate_limit_name(name),
                rate_limit_batch(requests_per_s),
                slot_decay_per_second=requests_per_s,
                client=client,
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
    from prefect.exceptions import ObjectNotFound

    limit_name = rate_limit_name(name)
    async with prefect_client() as client:
        try:
            found = await client.read_global_concurrency_limit_by_name(limit_name)
        except ObjectNotFound:
            raise VfopsError(
                f"no Prefect global concurrency limit {limit_name!r}; create it with "
                f"vfops.orchestration.ensure_limits({name!r}, requests_per_s=...) or "
                f"`prefect gcl create {limit_name} --limit N --slot-decay-per-second R`"
            ) from None
    if found.slot_decay_per_second <= 0:
        raise VfopsError(
            f"Prefect global concurrency limit {limit_name!r} has no slot decay, so it is "
            "not a rate limit; set --slot-decay-per-second to the requests per second"
        )
    return found.limit, found.slot_decay_per_second


@contextlib.asynccontextmanager
async def gpu_slots(name: str, gpus: int, *, lease_s: float = GPU_LEASE_S) -> AsyncIterator[None]:
    """Hold ``gpus`` slots of the global concurrency limit ``name`` for the block (none
    for a CPU run, ``gpus <= 0``). The limit is created with ``limit = gpus`` when
    missing, else left as the operator set it; the slots are held under a lease."""
    if gpus <= 0:
        yield
        return
    from prefect.concurrency.asyncio import concurrency

    await ensure_limit(name, gpus, update=False)
    async with concurrency(name, occupy=gpus, lease_duration=lease_s, strict=True):
        yield
