"""Tags on eval runs.

Why: scheduled sweeps need to find "the previous nightly run of this cell" and
re-running the same night must resume rather than start over. A run's tags (for
example ``nightly`` and ``nightly:2026-11-29``) say which schedule produced it and
are part of its configuration fingerprint.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("eval_runs") as batch:
        batch.add_column(sa.Column("tags", JSON, nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("eval_runs") as batch:
        batch.drop_column("tags")
