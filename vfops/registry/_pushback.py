"""Endpoint pushback: a counter per endpoint that every process using it shares.

A process whose adaptive limiter backed off on an endpoint's 429s increments the
endpoint's epoch; the others see the epoch move and back off too (see
:class:`vfops.budget.PeerSync`), so processes on any machines that share one
provider limit share the learning of it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from vfops.registry._models import Base, EndpointPushbackRow, utcnow
from vfops.registry._sql import on_conflict_insert, session_dialect


@dataclass(frozen=True, slots=True)
class Pushback:
    """An endpoint's pushbacks: how many, the reporter's limit after the last, when."""

    epoch: int
    limit_hint: float | None
    updated_at: dt.datetime | None


def bump_pushback(session: Session, endpoint: str, limit: float | None = None) -> int:
    """Record one pushback on ``endpoint`` (and the reporter's limit after it); the
    new epoch (one upsert + increment)."""
    table = Base.metadata.tables["endpoint_pushback"]
    session.execute(
        on_conflict_insert(session_dialect(session), table)
        .values(endpoint=endpoint, epoch=0, updated_at=utcnow())
        .on_conflict_do_nothing(index_elements=["endpoint"])
    )
    epoch = session.execute(
        update(EndpointPushbackRow)
        .where(EndpointPushbackRow.endpoint == endpoint)
        .values(epoch=EndpointPushbackRow.epoch + 1, limit_hint=limit, updated_at=utcnow())
        .returning(EndpointPushbackRow.epoch)
    ).scalar_one()
    return int(epoch)


def pushback_epoch(session: Session, endpoint: str) -> int:
    """How many pushbacks ``endpoint`` has had (0: none recorded)."""
    return read_pushback(session, endpoint).epoch


def read_pushback(session: Session, endpoint: str) -> Pushback:
    row = session.execute(
        select(
            EndpointPushbackRow.epoch,
            EndpointPushbackRow.limit_hint,
            EndpointPushbackRow.updated_at,
        ).where(EndpointPushbackRow.endpoint == endpoint)
    ).one_or_none()
    if row is None:
        return Pushback(0, None, None)
    epoch, hint, updated = row
    if updated is not None and updated.tzinfo is None:  # SQLite: naive, stored as UTC
        updated = updated.replace(tzinfo=dt.UTC)
    return Pushback(int(epoch), hint, updated)
