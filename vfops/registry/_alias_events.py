"""Alias events: the append-only log of promotion decisions on model aliases.

Only inserts and reads live here: a decision, once recorded, is never updated or
deleted, so "who held the alias when, and on what evidence" can be reconstructed.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from vfops.registry._models import AliasEventRow


def record_alias_event(
    session: Session,
    *,
    actor: str,
    model_name: str,
    alias: str,
    from_version: str | None,
    to_version: str,
    outcome: str,
    forced: bool,
    metric: str,
    evidence: dict[str, Any],
    reason: str,
) -> AliasEventRow:
    """Append one decision (flushed: its ``id`` is set); committed with ``session``."""
    row = AliasEventRow(
        actor=actor,
        model_name=model_name,
        alias=alias,
        from_version=from_version,
        to_version=to_version,
        outcome=outcome,
        forced=forced,
        metric=metric,
        evidence=dict(evidence),
        reason=reason,
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
