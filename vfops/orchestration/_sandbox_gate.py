"""Sandbox containers across a fleet of workers: one slot of a Prefect global concurrency
limit per live container (:class:`PrefectFleetGate`, a ``vfops.sandbox`` fleet gate).

Each worker's host has its own limit (``VFOPS_SANDBOX_MAX_CONTAINERS``); a sweep's cells
also share this one, so a sweep fanned out to many workers never starts more containers
than the cluster (or a shared engine behind it) holds. A slot is taken under a lease as
long as a container may live (its main process ends itself then): a worker killed with
its containers gives its slots back when their leases run out.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final
from uuid import UUID

from vfops.orchestration._limits import ensure_limit
from vfops.orchestration._pools import prefect_client

if TYPE_CHECKING:
    import httpx

SANDBOX_LIMIT: Final = "sandbox-containers"
"""The global concurrency limit sweep cells share (``prefect gcl update`` sets its size)."""
DEFAULT_FLEET_CONTAINERS: Final = 64
"""Its size when vfops creates it (an operator's value is left as it is)."""
_FULL_RETRY_S: Final = 0.5
"""How long to wait before asking again when the limit is full and the server gives no
Retry-After (a slot's release is not an event this process can await)."""


class PrefectFleetGate:
    """One slot of the global concurrency limit ``name`` per container."""

    def __init__(
        self, name: str = SANDBOX_LIMIT, *, limit: int = DEFAULT_FLEET_CONTAINERS,
        lease_s: float = 3600.0,
    ) -> None:  # fmt: skip
        self.name = name
        self.limit = limit
        self.lease_s = lease_s
        self._ensured = False

    async def acquire(self) -> UUID:
        import httpx

        if not self._ensured:
            await ensure_limit(self.name, self.limit, update=False)
            self._ensured = True
        async with prefect_client() as client:
            while True:
                try:
                    response = await client.increment_concurrency_slots_with_lease(
                        names=[self.name], slots=1, mode="concurrency",
                        lease_duration=self.lease_s,
                    )  # fmt: skip
                except httpx.HTTPStatusError as exc:
                    if exc.response.status_code != 423:  # 423: every slot is taken
                        raise
                    await asyncio.sleep(_retry_after(exc.response))
                    continue
                return UUID(str(response.json()["lease_id"]))

    async def release(self, held: Any) -> None:
        async with prefect_client() as client:
            await client.release_concurrency_slots_with_lease(lease_id=held)


def _retry_after(response: httpx.Response) -> float:
    try:
        return max(0.05, float(response.headers.get("Retry-After", _FULL_RETRY_S)))
    except ValueError:
        return _FULL_RETRY_S
