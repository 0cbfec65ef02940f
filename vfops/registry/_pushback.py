"""Endpoint pushback: a counter per endpoint that every process using it shares.

A process whose adaptive limiter backed off on an endpoint's 429s increments the
endpoint's epoch; the others see the epoch move and back off too (see
:class:`vfops.budget.PeerSync`), so processes on any machines that share one
provider limit share the learning of it.
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from vfops.registry._models import EndpointPushbackRow, utcnow


def bump_pushback(session: Session, endpoint: str) -> int:
    """Record one pushback on ``endpoint``; its new epoch (one upsert + increment)."""
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    session.execute(
        insert(EndpointPushbackRow)
        .values(endpoint=endpoint, epoch=0, updated_at=utcnow())
        .on_conflict_do_nothing(index_elements=[EndpointPushbackRow.endpoint])
    )
    epoch = session.execute(
        update(EndpointPushbackRow)
        .where(EndpointPushbackRow.endpoint == endpoint)
        .values(epoch=EndpointPushbackRow.epoch + 1, updated_at=utcnow())
        .returning(EndpointPushbackRow.epoch)
    ).scalar_one()
    return int(epoch)


def pushback_epoch(session: Session, endpoint: str) -> int:
    """How many pushbacks ``endpoint`` has had (0: none recorded)."""
    epoch = session.execute(
        select(EndpointPushbackRow.epoch).where(EndpointPushbackRow.endpoint == endpoint)
    ).scalar_one_or_none()
    return 0 if epoch is None else int(epoch)
