"""Spending caps at request time: the ledger a priced client reserves against.

A :class:`CostLedger` is set for the duration of an evaluation (:func:`use_ledger`,
a context variable, so every priced client in it — the policy's and the judges'
— reserves against the same caps without being handed the ledger). The
evaluation's ledger is :class:`RegistryLedger`: the registry's ``cost_budgets``,
shared by every process and worker (see :mod:`vfops.registry._costs`).

:func:`charge_rollout` attributes a call's cost to the rollout being scored (a
judge's call), through a second context variable the rubric sets per rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from vfops._errors import VfopsError
from vfops.costs._pricing import CAP_TOLERANCE_USD, format_cost

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from vfops._rollout import TokenUsage
    from vfops.registry import CostBudget

T = TypeVar("T")

BUDGET_EXHAUSTED_EXIT_CODE = 5
RESERVE_POLL_S = 0.2
"""How often a reservation waiting for room looks again (settlements by other
processes are seen no later than this)."""


class BudgetExhausted(VfopsError):
    """A request's worst-case cost does not fit a spending cap: the run stops."""

    exit_code = BUDGET_EXHAUSTED_EXIT_CODE

    def __init__(
        self,
        scope: str,
        cap_usd: float | None,
        spent_usd: float,
        needed_usd: float,
        note: str = "",
    ):
        self.scope, self.cap_usd, self.spent_usd, self.needed_usd = (
            scope,
            cap_usd,
            spent_usd,
            needed_usd,
        )
        self.note = note
        """Why the next request's worst case is what it is, and what lowers it."""
        text = (
            f"cost cap of {scope} reached: {format_cost(spent_usd)} spent of the "
            f"{format_cost(cap_usd)} cap, and the next request may cost up to "
            f"{format_cost(needed_usd)}"
        )
        super().__init__(f"{text} ({note})" if note else text)

    def with_note(self, note: str) -> BudgetExhausted:
        """The same refusal, saying ``note`` (e.g. what the worst case assumed)."""
        return type(self)(self.scope, self.cap_usd, self.spent_usd, self.needed_usd, note)


class CostLedger(Protocol):
    """Reserves a request's worst-case cost before it is sent, settles it after."""

    async def reserve(self, usd: float) -> str:
        """A reservation id; raises :class:`BudgetExhausted` when a cap has no room."""
        ...

    async def settle(self, reservation: str, actual_usd: float) -> None:
        """Replace the reservation by what the request cost."""
        ...


_LEDGER: ContextVar[CostLedger | None] = ContextVar("vfops_cost_ledger", default=None)
_ROLLOUT_USAGE: ContextVar[TokenUsage | None] = ContextVar("vfops_rollout_usage", default=None)


def current_ledger() -> CostLedger | None:
    return _LEDGER.get()


@contextlib.contextmanager
def use_ledger(ledger: CostLedger | None) -> Iterator[None]:
    """Priced requests made inside (tasks created inside too) reserve on ``ledger``."""
    token = _LEDGER.set(ledger)
    try:
        yield
    finally:
        _LEDGER.reset(token)


def scoring_rollout(usage: TokenUsage | None) -> None:
    """Attribute the calls made from here on in this task to the rollout of ``usage``
    (the rubric sets it in each rollout's scoring task)."""
    _ROLLOUT_USAGE.set(usage)


def charge_rollout(usd: float | None) -> None:
    """Add a judge call's cost to the rollout it scores (nothing outside scoring)."""
    usage = _ROLLOUT_USAGE.get()
    if usage is not None:
        usage.add_cost(usd)


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
