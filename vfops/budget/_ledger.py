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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from vfops.costs import CAP_TOLERANCE_USD, BudgetExhausted

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from vfops.registry import CostBudget

T = TypeVar("T")

RESERVE_POLL_S = 0.2
"""How often a reservation waiting for room looks again (settlements by other
processes are seen no later than this)."""


class RegistryCalls(Protocol):
    """What runs a registry function ``fn(engine, *args)`` for the ledger (an
    evaluation's registry calls: a worker thread or the registry child process)."""

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...


class RegistryLedger:
    """The evaluation's caps in the registry: each reservation is one transaction on
    every scope at once (e.g. the run's own cap and its sweep's)."""

    def __init__(self, calls: RegistryCalls, scopes: Sequence[str], run_id: str | None) -> None:
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
            full = await self.calls.call(_reserve, reservation, self.scopes, usd, self.run_id)
            if full is None:
                self.reserved += 1
                return reservation
            if full.cap_usd is None or full.spent_usd + usd > full.cap_usd + CAP_TOLERANCE_USD:
                raise BudgetExhausted(full.scope, full.cap_usd, full.spent_usd, usd)
            # a settlement here wakes it at once; one elsewhere within the poll interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(settled.wait(), RESERVE_POLL_S)

    async def settle(self, reservation: str, actual_usd: float) -> None:
        await self.calls.call(_settle, reservation, self.scopes, actual_usd)
        self._settled().set()

    def _settled(self) -> asyncio.Event:
        """An event set at the next settlement of this ledger (one per waiting round)."""
        event = self._event
        if event is None or event.is_set():
            event = self._event = asyncio.Event()
        return event


def _reserve(
    engine: Engine, reservation: str, scopes: Sequence[str], usd: float, run_id: str | None
) -> CostBudget | None:
    from vfops.registry import reserve_cost, session_scope

    try:
        with session_scope(engine) as session:
            full = reserve_cost(session, reservation, scopes, usd, run_id=run_id)
            if full is not None:
                raise _Refused(full)  # rolls back what other scopes took
    except _Refused as refused:
        return refused.budget
    return None


class _Refused(Exception):
    def __init__(self, budget: CostBudget) -> None:
        self.budget = budget


def _settle(engine: Engine, reservation: str, scopes: Sequence[str], actual_usd: float) -> None:
    from vfops.registry import session_scope, settle_cost

    with session_scope(engine) as session:
        settle_cost(session, reservation, scopes, actual_usd)


def set_caps(engine: Engine, caps: dict[str, float | None], run_id: str | None) -> None:
    """Create or update the caps and release ``run_id``'s stale reservations (its
    earlier process's: this one holds the run's lease now); one transaction."""
    from vfops.registry import release_run_reservations, session_scope, set_cost_caps

    with session_scope(engine) as session:
        set_cost_caps(session, caps)
        if run_id is not None:
            release_run_reservations(session, run_id)
