"""Append-only log of model alias decisions.

Why: promotion moves an MLflow registry alias (``champion``) only on evidence,
and who held an alias when must never be lost. Every decision, promoted or
refused, forced or not, is one row here: actor, time, model, alias, from and to
version, the eval run ids and per-environment deltas it rested on. vfops only
ever inserts into this table.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
BIGINT_PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "alias_events",
        sa.Column("id", BIGINT_PK, autoincrement=True, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("model_name", sa.String(length=300), nullable=False),
        sa.Column("alias", sa.String(length=100), nullable=False),
        sa.Column("from_version", sa.String(length=40), nullable=True),
        sa.Column("to_version", sa.String(length=40), nullable=False),
        sa.Column("outcome", sa.String(length=20), nullable=False),
        sa.Column("forced", sa.Boolean(), nullable=False),
        sa.Column("metric", sa.String(length=100), nullable=False),
        sa.Column("evidence", JSON, nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alias_events")),
    )
    op.create_index(
        "ix_alias_events_model_alias", "alias_events", ["model_name", "alias", "id"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_alias_events_model_alias", table_name="alias_events")
    op.drop_table("alias_events")
