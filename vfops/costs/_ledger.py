"""Spending caps at request time: the ledger a priced client reserves against.

A :class:`CostLedger` is set for the duration of an evaluation (:func:`use_ledger`,
a context variable, so every priced client in it — the policy's and the judges'
— reserves against the same caps without being handed the ledger). The
evaluation's ledger is :class:`vfops.budget.RegistryLedger` (the registry's
``cost_budgets``, shared by every process and worker): it lives above the
registry, so this module, which the clients import, stays below it.

:func:`charge_rollout` attributes a call's cost to the rollout being scored (a
judge's call), through a second context variable the rubric sets per rollout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

from vfops._errors import VfopsError
from vfops.costs._pricing import format_cost

if TYPE_CHECKING:
    from vfops._rollout import TokenUsage

BUDGET_EXHAUSTED_EXIT_CODE = 5


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
