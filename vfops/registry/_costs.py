"""The cost ledger: spending caps shared by every process and worker.

A request's worst-case cost is *reserved* before it is sent and *settled* from its
real usage after. A reservation is one transaction: a compare-and-set UPDATE that
only matches while ``spent + reserved + amount <= cap`` (PostgreSQL re-checks the
condition on the row it locked, SQLite serialises writers), so processes on any
machines sharing the registry cannot together spend past a cap by more than what
their requests in flight may exceed their reservations.

Reservations of a process that died are released when another process takes its
run over (:func:`release_run_reservations`), or after they expire.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from sqlalchemy import case, delete, insert, select, update
from sqlalchemy.orm import Session

from vfops.costs import CAP_TOLERANCE_USD
from vfops.registry._models import (
    Base,
    CostBudgetRow,
    CostReservationRow,
    utcnow,
)
from vfops.registry._sql import on_conflict_insert, session_dialect

_BUDGETS = Base.metadata.tables["cost_budgets"]

RESERVATION_TTL_S: Final = 3600.0
"""A reservation nobody settled (its process died) stops counting after this long."""


@dataclass(frozen=True, slots=True)
class CostBudget:
    """A cap (``None``: none) and what was spent and is reserved against it."""

    scope: str
    cap_usd: float | None
    spent_usd: float
    reserved_usd: float

    @property
    def left_usd(self) -> float | None:
        return None if self.cap_usd is None else self.cap_usd - self.spent_usd - self.reserved_usd


def set_cost_caps(session: Session, caps: Mapping[str, float | None]) -> None:
    """Create each scope's budget, or set its cap (a higher cap continues a capped run;
    ``None`` lifts it). What was spent is kept. An upsert: processes starting together
    (two sweeps naming one scope) both succeed."""
    for scope, cap in sorted(caps.items()):
        statement = on_conflict_insert(session_dialect(session), _BUDGETS).values(
            scope=scope, cap_usd=cap, spent_usd=0.0, reserved_usd=0.0, updated_at=utcnow()
        )
        session.execute(
            statement.on_conflict_do_update(
                index_elements=[_BUDGETS.c.scope],
                set_={"cap_usd": statement.excluded.cap_usd, "updated_at": utcnow()},
            )
        )


def get_cost_budget(session: Session, scope: str) -> CostBudget | None:
    row = session.get(CostBudgetRow, scope)
    if row is None:
        return None
    return CostBudget(row.scope, row.cap_usd, row.spent_usd, row.reserved_usd)


def reserve_cost(
    session: Session,
    reservation_id: str,
    scopes: Sequence[str],
    usd: float,
    *,
    run_id: str | None,
    ttl_s: float = RESERVATION_TTL_S,
) -> CostBudget | None:
    """Reserve ``usd`` on every scope (in the caller's transaction); ``None`` when
    done, else the budget that has no room (the caller rolls the transaction back)."""
    now = utcnow()
    for scope in sorted(scopes):  # one order everywhere: no deadlock between two reservers
        if not _take(session, scope, usd):
            _reclaim_expired(session, scope, now)
            if not _take(session, scope, usd):
                return get_cost_budget(session, scope)
        session.execute(
            insert(CostReservationRow).values(
                id=reservation_id,
                scope=scope,
                usd=usd,
                run_id=run_id,
                expires_at=now + dt.timedelta(seconds=ttl_s),
            )
        )
    return None


def _take(session: Session, scope: str, usd: float) -> bool:
    room = (CostBudgetRow.cap_usd.is_(None)) | (
        CostBudgetRow.spent_usd + CostBudgetRow.reserved_usd + usd
        <= CostBudgetRow.cap_usd + CAP_TOLERANCE_USD
    )
    taken = session.execute(
        update(CostBudgetRow)
        .where(CostBudgetRow.scope == scope, room)
        .values(reserved_usd=CostBudgetRow.reserved_usd + usd)
    )
    return bool(taken.rowcount)  # type: ignore[attr-defined]


def _release(session: Session, scope: str, usd: float, spent: float) -> None:
    session.execute(
        update(CostBudgetRow)
        .where(CostBudgetRow.scope == scope)
        .values(
            # never below 0: float sums of many small amounts do not cancel exactly
            reserved_usd=case(
                (CostBudgetRow.reserved_usd - usd < 0, 0.0),
                else_=CostBudgetRow.reserved_usd - usd,
            ),
            spent_usd=CostBudgetRow.spent_usd + spent,
            updated_at=utcnow(),
        )
    )


def _reclaim_expired(session: Session, scope: str, now: dt.datetime) -> None:
    gone = session.execute(
        delete(CostReservationRow)
        .where(CostReservationRow.scope == scope, CostReservationRow.expires_at < now)
        .returning(CostReservationRow.usd)
    ).all()
    if gone:
        _release(session, scope, sum(usd for (usd,) in gone), 0.0)


def settle_cost(
    session: Session, reservation_id: str, scopes: Sequence[str], actual_usd: float
) -> None:
    """Replace a reservation by what the request really cost, on every scope. A
    reservation already released (expired) still has its real cost added."""
    for scope in sorted(scopes):
        held = session.execute(
            delete(CostReservationRow)
            .where(CostReservationRow.id == reservation_id, CostReservationRow.scope == scope)
            .returning(CostReservationRow.usd)
        ).all()
        _release(session, scope, sum(usd for (usd,) in held), actual_usd)


def release_run_reservations(session: Session, run_id: str) -> int:
    """Drop the reservations of ``run_id``'s earlier process (called by the one that
    now holds the run's lease, so none of them is still in flight); how many."""
    gone = session.execute(
        delete(CostReservationRow)
        .where(CostReservationRow.run_id == run_id)
        .returning(CostReservationRow.scope, CostReservationRow.usd)
    ).all()
    for scope, usd in gone:
        _release(session, scope, usd, 0.0)
    return len(gone)


def run_cost(session: Session, run_id: str) -> float | None:
    """The sum of a run's rollout costs; ``None`` when no rollout is priced."""
    from vfops.registry._models import EvalRunRow

    return session.execute(
        select(EvalRunRow.cost_usd).where(EvalRunRow.id == run_id)
    ).scalar_one_or_none()


@dataclass(frozen=True, slots=True)
class RunCost:
    """A run's spend: the sum over its rollouts (``None``: no rollout was priced)."""

    run_id: str
    environment_name: str
    model: str
    started_at: dt.datetime
    status: str
    rollouts: int
    priced_rollouts: int
    cost_usd: float | None


def run_costs(
    session: Session,
    *,
    env_name: str | None = None,
    model: str | None = None,
    since: dt.datetime | None = None,
) -> list[RunCost]:
    """Every run's cost (oldest first), filtered by environment, model, start time.

    Read from the totals each run keeps (see ``_rollouts.py``): one row per run, however
    many rollouts are stored.
    """
    from vfops.registry._models import EvalRunRow

    query = select(
        EvalRunRow.id,
        EvalRunRow.environment_name,
        EvalRunRow.model,
        EvalRunRow.started_at,
        EvalRunRow.status,
        EvalRunRow.rollouts_stored,
        EvalRunRow.rollouts_priced,
        EvalRunRow.cost_usd,
    ).order_by(EvalRunRow.started_at, EvalRunRow.id)
    if env_name is not None:
        query = query.where(EvalRunRow.environment_name == env_name)
    if model is not None:
        query = query.where(EvalRunRow.model == model)
    if since is not None:
        query = query.where(EvalRunRow.started_at >= since)
    return [
        RunCost(
            run_id,
            env,
            run_model,
            started,
            status,
            int(count),
            int(priced),
            None if total is None else float(total),
        )
        for run_id, env, run_model, started, status, count, priced, total in session.execute(query)
    ]
