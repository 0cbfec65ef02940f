"""Each eval run keeps its rollouts' count and cost; the newest runs are indexed.

Why: ``vfops runs list`` counted each listed run's rollouts and ``vfops runs cost``
summed the costs of every rollout ever stored, so both grew with the rollouts table
(a year of nightly sweeps is ~150M rows). ``rollouts_stored``, ``rollouts_priced``
and ``cost_usd`` are now kept on the run by the functions that write rollouts, in
the same transaction, and backfilled here from the rows already stored;
``ix_eval_runs_started_at_id`` serves "the newest runs" without a sort.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# One pass over the rollouts (grouped by run), not one query per run. UPDATE ... FROM
# is PostgreSQL's and SQLite's (3.33+) alike.
_BACKFILL = """
UPDATE eval_runs SET rollouts_stored = totals.stored, rollouts_priced = totals.priced,
       cost_usd = totals.cost
FROM (SELECT run_id, count(*) AS stored, count(cost_usd) AS priced, sum(cost_usd) AS cost
      FROM rollouts GROUP BY run_id) AS totals
WHERE eval_runs.id = totals.run_id
"""


# recreate="never": SQLite adds and drops these columns in place; rebuilding eval_runs
# would drop the old table, which ON DELETE CASCADE turns into deleting every rollout.


def upgrade() -> None:
    with op.batch_alter_table("eval_runs", recreate="never") as batch:
        batch.add_column(
            sa.Column("rollouts_stored", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("rollouts_priced", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("cost_usd", sa.Float(), nullable=True))
        batch.create_index("ix_eval_runs_started_at_id", ["started_at", "id"])
    op.execute(_BACKFILL)


def downgrade() -> None:
    with op.batch_alter_table("eval_runs", recreate="never") as batch:
        batch.drop_index("ix_eval_runs_started_at_id")
        batch.drop_column("cost_usd")
        batch.drop_column("rollouts_priced")
        batch.drop_column("rollouts_stored")
