"""Initial registry schema.

Why: the registry starts here. Environments and their immutable published
versions, eval runs, their rollouts (written exactly once per run, example and
rollout index, which makes resume and concurrent writers safe) and the judge
cache. Every later change to ``vfops/registry/_models.py`` gets its own revision
after this one, so existing databases upgrade in place with ``vfops db upgrade``.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A migration is frozen in time: it spells its types out instead of importing them
# from _models.py, whose later edits must not change what this revision creates.
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
BIGINT_PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _created_at() -> sa.Column[dt.datetime]:
    return sa.Column(
        "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
    )


def upgrade() -> None:
    # one helper per table group, in the order the tables were always created
    _environments()
    _judge_cache()
    _environment_versions()
    _eval_runs()
    _rollouts()


def _environments() -> None:
    """Environment names."""
    op.create_table(
        "environments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_environments")),
        sa.UniqueConstraint("name", name=op.f("uq_environments_name")),
    )


def _judge_cache() -> None:
    """Judge replies by request hash."""
    op.create_table(
        "judge_cache",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("judge_model", sa.String(length=300), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("response", sa.Text(), nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_judge_cache")),
    )


def _environment_versions() -> None:
    """Published versions (immutable) and their lookup indexes."""
    op.create_table(
        "environment_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("environment_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("version_major", sa.Integer(), nullable=False),
        sa.Column("version_minor", sa.Integer(), nullable=False),
        sa.Column("version_patch", sa.Integer(), nullable=False),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("code_hash", sa.String(length=64), nullable=False),
        sa.Column("wheel_sha256", sa.String(length=64), nullable=False),
        sa.Column("sdist_sha256", sa.String(length=64), nullable=False),
        sa.Column("wheel_uri", sa.Text(), nullable=False),
        sa.Column("sdist_uri", sa.Text(), nullable=False),
        sa.Column("datasets", JSON, nullable=False),
        sa.Column("dependencies", JSON, nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("readme", sa.Text(), nullable=True),
        _created_at(),
        sa.ForeignKeyConstraint(
            ["environment_id"],
            ["environments.id"],
            name=op.f("fk_environment_versions_environment_id_environments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_environment_versions")),
        sa.UniqueConstraint(
            "environment_id",
            "version",
            name=op.f("uq_environment_versions_environment_id_version"),
        ),
    )
    op.create_index(
        "ix_environment_versions_latest",
        "environment_versions",
        ["environment_id", "version_major", "version_minor", "version_patch"],
    )
    op.create_index(
        "ix_environment_versions_code_hash",
        "environment_versions",
        ["environment_id", "code_hash"],
    )


def _eval_runs() -> None:
    """Eval runs and their lookup indexes."""
    op.create_table(
        "eval_runs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("environment_name", sa.String(length=200), nullable=False),
        sa.Column("environment_version_id", sa.Integer(), nullable=True),
        sa.Column("environment_version", sa.String(length=80), nullable=False),
        sa.Column("environment_content_hash", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=300), nullable=False),
        sa.Column("base_url", sa.Text(), nullable=True),
        sa.Column("sampling_args", JSON, nullable=False),
        sa.Column("env_args", JSON, nullable=False),
        sa.Column("num_examples", sa.Integer(), nullable=False),
        sa.Column("rollouts_per_example", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("config_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("summary", JSON, nullable=False),
        sa.Column("vfops_version", sa.String(length=40), nullable=False),
        sa.Column("output_dir", sa.Text(), nullable=True),
        sa.Column("mlflow_run_id", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(
            ["environment_version_id"],
            ["environment_versions.id"],
            name=op.f("fk_eval_runs_environment_version_id_environment_versions"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_runs")),
    )
    op.create_index("ix_eval_runs_config_fingerprint", "eval_runs", ["config_fingerprint"])
    op.create_index(
        "ix_eval_runs_environment_started", "eval_runs", ["environment_name", "started_at"]
    )


def _rollouts() -> None:
    """Rollouts, one per (run, example, rollout index)."""
    op.create_table(
        "rollouts",
        sa.Column("id", BIGINT_PK, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("example_id", sa.BigInteger(), nullable=False),
        sa.Column("rollout_index", sa.Integer(), nullable=False),
        sa.Column("trace_id", sa.String(length=32), nullable=False),
        sa.Column("task", sa.String(length=200), nullable=False),
        sa.Column("prompt", JSON, nullable=False),
        sa.Column("completion", JSON, nullable=False),
        sa.Column("answer", sa.Text(), nullable=False),
        sa.Column("info", JSON, nullable=False),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("metrics", JSON, nullable=False),
        sa.Column("stop_reason", sa.String(length=32), nullable=False),
        sa.Column("error_type", sa.String(length=200), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("error_stage", sa.String(length=20), nullable=True),
        sa.Column("generation_ms", sa.Float(), nullable=False),
        sa.Column("scoring_ms", sa.Float(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("turns", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["eval_runs.id"],
            name=op.f("fk_rollouts_run_id_eval_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollouts")),
        sa.UniqueConstraint(
            "run_id",
            "example_id",
            "rollout_index",
            name=op.f("uq_rollouts_run_id_example_id_rollout_index"),
        ),
    )
    op.create_index(op.f("ix_rollouts_trace_id"), "rollouts", ["trace_id"])


def downgrade() -> None:
    # children first: foreign keys point at the tables dropped after them
    op.drop_table("rollouts")
    op.drop_table("eval_runs")
    op.drop_table("environment_versions")
    op.drop_table("judge_cache")
    op.drop_table("environments")
