"""A completed run's transcripts can move to Parquet in the artifact store.

Why: prompts and completions are ~80 % of a rollout's bytes, read one run at a
time by a person, while every registry command reads only the per-rollout summary.
A year of nightly sweeps (~150M rollouts) keeps its summaries in PostgreSQL and
moves older runs' transcripts to one Parquet file per run in the artifact store
(``vfops runs archive``). ``eval_runs.transcripts_uri`` names that file;
``rollouts.prompt`` and ``rollouts.completion`` may now be NULL (archived).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(JSONB(), "postgresql")


# eval_runs is altered in place (recreate="never": see 0006); rollouts, which no table
# references, is rebuilt by SQLite's batch mode to change NULL constraints.


def upgrade() -> None:
    with op.batch_alter_table("eval_runs", recreate="never") as batch:
        batch.add_column(sa.Column("transcripts_uri", sa.Text(), nullable=True))
    with op.batch_alter_table("rollouts") as batch:
        batch.alter_column("prompt", existing_type=_JSON, nullable=True)
        batch.alter_column("completion", existing_type=_JSON, nullable=True)


def downgrade() -> None:
    # only while no run is archived: its transcripts would be lost otherwise
    with op.batch_alter_table("rollouts") as batch:
        batch.alter_column("completion", existing_type=_JSON, nullable=False)
        batch.alter_column("prompt", existing_type=_JSON, nullable=False)
    with op.batch_alter_table("eval_runs", recreate="never") as batch:
        batch.drop_column("transcripts_uri")
