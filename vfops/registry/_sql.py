"""Statement helpers shared by the registry's query modules."""

from __future__ import annotations

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from vfops._errors import VfopsError


def on_conflict_insert(dialect_name: str, table: Table) -> sqlite.Insert | postgresql.Insert:
    """An INSERT on ``table`` that can take ``.on_conflict_do_nothing(...)``."""
    # Both dialects spell "insert or ignore" as INSERT ... ON CONFLICT DO NOTHING.
    if dialect_name == "postgresql":
        return postgresql.insert(table)
    if dialect_name == "sqlite":
        return sqlite.insert(table)
    raise VfopsError(f"unsupported registry database dialect {dialect_name!r}")


def session_dialect(session: Session) -> str:
    return session.get_bind().dialect.name
