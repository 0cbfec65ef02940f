"""What a rollout cost, spending caps shared by every process, endpoint pushback.

Why: evaluations and judge calls against hosted APIs cost money, and a sweep over
a grid of models can spend far more than anyone meant. Each rollout now records
its cached prompt tokens and its cost in USD (NULL: the endpoint is unpriced,
never 0). ``cost_budgets`` holds a cap per scope (a run, a sweep, a name several
sweeps share) with what was spent and what is reserved by requests in flight;
``cost_reservations`` holds each in-flight request's worst-case cost, so a process
that dies cannot leave its reservations counted forever. ``endpoint_pushback``
counts the 429 pushbacks each endpoint gave any process, so adaptive concurrency
limiters in other processes back off together.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("rollouts") as batch:
        # rows written before prices existed had no cached tokens and no known cost
        batch.add_column(
            sa.Column("cached_tokens", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("cost_usd", sa.Float(), nullable=True))
    with op.batch_alter_table("rollouts") as batch:  # new rows always state it
        batch.alter_column("cached_tokens", server_default=None)
    op.create_table(
        "cost_budgets",
        sa.Column("scope", sa.String(length=300), nullable=False),
        sa.Column("cap_usd", sa.Float(), nullable=True),
        sa.Column("spent_usd", sa.Float(), nullable=False),
        sa.Column("reserved_usd", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scope", name=op.f("pk_cost_budgets")),
    )
    op.create_table(
        "cost_reservations",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("scope", sa.String(length=300), nullable=False),
        sa.Column("usd", sa.Float(), nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["scope"],
            ["cost_budgets.scope"],
            name=op.f("fk_cost_reservations_scope_cost_budgets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", "scope", name=op.f("pk_cost_reservations")),
    )
    op.create_index(
        op.f("ix_cost_reservations_run_id"), "cost_reservations", ["run_id"], unique=False
    )

    op.create_table(
        "endpoint_pushback",
        sa.Column("endpoint", sa.String(length=500), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("limit_hint", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("endpoint", name=op.f("pk_endpoint_pushback")),
    )


def downgrade() -> None:
    op.drop_table("endpoint_pushback")
    op.drop_index(op.f("ix_cost_reservations_run_id"), table_name="cost_reservations")
    op.drop_table("cost_reservations")
    op.drop_table("cost_budgets")
    with op.batch_alter_table("rollouts") as batch:
        batch.drop_column("cost_usd")
        batch.drop_column("cached_tokens")
