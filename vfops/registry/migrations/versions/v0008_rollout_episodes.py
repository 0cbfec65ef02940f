"""Rollouts record the episode and agent of their trace.

Why: a verifiers v1 ``Env`` may produce several traces per episode (two agents
playing each other, one role run twice and compared in ``finalize``). Each trace is
one rollout; ``episode`` names the planned episode they share (NULL when the episode
produced one trace) and ``agent`` the role whose trace it is ('' for one agent), so
``vfops runs show`` can show an episode's traces together and training can keep the
trained roles' traces.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# recreate="never": both are added in place (SQLite's ADD COLUMN), no table rebuilt
def upgrade() -> None:
    with op.batch_alter_table("rollouts", recreate="never") as batch:
        batch.add_column(sa.Column("episode", sa.Integer(), nullable=True))
        batch.add_column(
            sa.Column("agent", sa.String(200), nullable=False, server_default=sa.text("''"))
        )


def downgrade() -> None:
    with op.batch_alter_table("rollouts") as batch:
        batch.drop_column("agent")
        batch.drop_column("episode")
