"""A lease on each eval run: who is working on it, until when.

Why: two processes must never work on one run. Two ``vfops eval --resume RUN`` of
the same run at once both generated the missing rollouts (the endpoint was asked
twice, ``results.jsonl`` held duplicates). A process takes the lease with one
compare-and-set UPDATE in a transaction, so it works across machines on a shared
PostgreSQL; it renews the lease while it runs and clears it when it ends. A lease
that expired, or whose holder is a dead process on the same host, can be taken over.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("eval_runs") as batch:
        batch.add_column(sa.Column("lease_owner", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("lease_expires", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("eval_runs") as batch:
        batch.drop_column("lease_expires")
        batch.drop_column("lease_owner")
