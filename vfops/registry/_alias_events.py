"""Alias events: the append-only log of promotion decisions on model aliases.

Only inserts and reads live here: a decision, once recorded, is never updated or
deleted, so "who held the alias when, and on what evidence" can be reconstructed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from vfops.registry._models import AliasEventRow


@dataclass(frozen=True)
class AliasEvent:
    """One promotion decision, as it is recorded (a new column is one field here)."""

    actor: str
    model_name: str
    alias: str
    from_version: str | None
    to_version: str
    outcome: str
    forced: bool
    metric: str
    evidence: Mapping[str, Any]
    reason: str


def record_alias_event(session: Session, event: AliasEvent) -> AliasEventRow:
    """Append one decision (flushed: its ``id`` is set); committed with ``session``."""
    row = AliasEventRow(
        actor=event.actor,
        model_name=event.model_name,
        alias=event.alias,
        from_version=event.from_version,
        to_version=event.to_version,
        outcome=event.outcome,
        forced=event.forced,
        metric=event.metric,
        evidence=dict(event.evidence),
        reason=event.reason,
    )
    session.add(row)
    session.flush()
    return row


def list_alias_events(
    session: Session, model_name: str, *, alias: str | None = None
) -> list[AliasEventRow]:
    """Every recorded decision on ``model_name`` (optionally one alias), oldest first."""
    query = select(AliasEventRow).where(AliasEventRow.model_name == model_name)
    if alias is not None:
        query = query.where(AliasEventRow.alias == alias)
    return list(session.scalars(query.order_by(AliasEventRow.id)))
