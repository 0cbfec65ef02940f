"""Alias events: the append-only log of promotion decisions on model aliases.

Only inserts and reads live here: a decision, once recorded, is never updated or
deleted, so "who held the alias when, and on what evidence" can be reconstructed.

Outcomes: ``promoted`` and ``refused`` (a gate's decision), and ``external``: the alias
was found on a version that the history did not put there (moved outside ``vfops
promote``, or by a promotion that died between the move and its record), appended by
the next decision so that every move in the history names the holder it replaced.

Moves of one alias are serialised by :func:`lock_alias` (MLflow's
``set_registered_model_alias`` has no compare-and-set): the promotion that holds the
lock reads the alias's holder, moves it and records the move before the next one reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from vfops.registry._db import _SQLITE_BEGIN
from vfops.registry._models import AliasEventRow

# the outcomes that move the alias (``refused`` leaves it where it was)
MOVES = ("promoted", "external")


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


def lock_alias(session: Session, model_name: str, alias: str) -> None:
    """Hold the lock on moves of ``model_name@alias`` until ``session`` ends.

    PostgreSQL: a transaction-scoped advisory lock keyed on the model and alias (no
    row has to exist: the first promotion of an alias locks too; other aliases and
    models are not blocked). SQLite: the write lock that a write session takes at its
    ``BEGIN IMMEDIATE`` (:func:`vfops.registry.session_scope`), which this requires.
    """
    connection = session.connection()
    if connection.dialect.name == "postgresql":
        session.execute(
            text("SELECT pg_advisory_xact_lock(:key)"), {"key": _alias_lock_key(model_name, alias)}
        )
    elif connection.get_execution_options().get(_SQLITE_BEGIN) != "IMMEDIATE":
        raise RuntimeError("lock_alias needs a write session: session_scope(engine, write=True)")


def _alias_lock_key(model_name: str, alias: str) -> int:
    # a signed 64-bit key (what pg_advisory_xact_lock takes), stable across processes
    digest = hashlib.blake2b(f"vfops.alias\0{model_name}\0{alias}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big", signed=True)


def recorded_holder(session: Session, model_name: str, alias: str) -> str | None:
    """The version the history says holds ``alias``: the last move's ``to_version``
    (None: no move recorded)."""
    query = (
        select(AliasEventRow.to_version)
        .where(
            AliasEventRow.model_name == model_name,
            AliasEventRow.alias == alias,
            AliasEventRow.outcome.in_(MOVES),
        )
        .order_by(AliasEventRow.id.desc())
        .limit(1)
    )
    return session.scalar(query)
