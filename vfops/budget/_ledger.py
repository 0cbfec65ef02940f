"""The evaluation's cost ledger in the registry: :class:`RegistryLedger`.

The caps' bookkeeping (``cost_budgets``, :mod:`vfops.registry._costs`) is shared by
every process and worker, so a cap holds across a sweep's cells on any machine. It
is here, above the registry, and not in :mod:`vfops.costs`: the clients import the
ledger's protocol and context variable from there, and the registry imports the
pricing tolerance from there, so costs must not import the registry back.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vfops.costs import CAP_TOLERANCE_USD, BudgetExhausted

if TYPE_CHECKING:
    from vfops.registry import RegistryService


RESERVE_POLL_S = 0.2
"""How often a reservation waiting for room looks again (settlements by other
processes are seen no later than this)."""


class RegistryLedger:
    """The evaluation's caps in the registry: each reservation is one transaction on
    every scope at once (e.g. the run's own cap and its sweep's)."""

    def __init__(self, calls: RegistryService, scopes: Sequence[str], run_id: str | None) -> None:
        self.calls, self.scopes, self.run_id = calls, tuple(scopes), run_id
        self.reserved = 0
        """How many reservations were made (requests sent under the caps)."""
        self._event: asyncio.Event | None = None

    async def reserve(self, usd: float) -> str:
        """Reserve ``usd`` on every scope. While the room is held by requests in flight
        (here or in other processes) this waits for them to settle; when what was spent
        alone leaves no room, it raises :class:`BudgetExhausted`."""
        while True:
            reservation = uuid.uuid4().hex
            settled = self._settled()
            full = await self.calls.call("cost.reserve", reservation, self.scopes, usd, self.run_id)
            if full is None:
                self.reserved += 1
                return reservation
            if full.cap_usd is None or full.spent_usd + usd > full.cap_usd + CAP_TOLERANCE_USD:
                raise BudgetExhausted(full.scope, full.cap_usd, full.spent_usd, usd)
            # a settlement here wakes it at once; one elsewhere within the poll interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(settled.wait(), RESERVE_POLL_S)

    async def settle(self, reservation: str, actual_usd: float) -> None:
        await self.calls.call("cost.settle", reservation, self.scopes, actual_usd)
        self._settled().set()

    def _settled(self) -> asyncio.Event:
        """An event set at the next settlement of this ledger (one per waiting round)."""
        event = self._event
        if event is None or event.is_set():
            event = self._event = asyncio.Event()
        return event
