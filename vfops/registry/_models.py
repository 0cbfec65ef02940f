"""The registry schema: SQLAlchemy 2 ``Mapped`` models on one ``Base``.

Every change here needs an Alembic migration in ``migrations/versions`` (a test
checks that ``upgrade head`` on an empty database yields exactly this schema).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from vfops._rollout import ROLLOUT_COLUMNS, RolloutColumn

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_N_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# JSONB on PostgreSQL (indexable, compact); JSON text elsewhere.
JSONType = JSON().with_variant(JSONB(), "postgresql")
# SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid alias).
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {  # noqa: RUF012 - SQLAlchemy reads this class attribute as-is
        dict[str, Any]: JSONType,
        list[Any]: JSONType,
        dt.datetime: DateTime(timezone=True),
    }


class EnvironmentRow(Base):
    """A named environment; its versions are immutable once published."""

    __tablename__ = "environments"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=func.now())

    versions: Mapped[list[EnvironmentVersionRow]] = relationship(back_populates="environment")


class EnvironmentVersionRow(Base):
    """One published version: what was built, hashed, snapshotted and uploaded."""

    __tablename__ = "environment_versions"
    __table_args__ = (
        UniqueConstraint("environment_id", "version"),
        # "latest version of an env": ordered by the numeric semver parts
        Index(
            "ix_environment_versions_latest",
            "environment_id",
            "version_major",
            "version_minor",
            "version_patch",
        ),
        # "which published version is this installed code?"
        Index("ix_environment_versions_code_hash", "environment_id", "code_hash"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id", ondelete="CASCADE"))
    version: Mapped[str] = mapped_column(String(64))
    version_major: Mapped[int]
    version_minor: Mapped[int]
    version_patch: Mapped[int]
    # sha256 over the package's source tree: what "same version, same content" means
    content_hash: Mapped[str] = mapped_column(String(64))
    # sha256 over the importable code the wheel installs: matched against installed code
    code_hash: Mapped[str] = mapped_column(String(64))
    wheel_sha256: Mapped[str] = mapped_column(String(64))
    sdist_sha256: Mapped[str] = mapped_column(String(64))
    wheel_uri: Mapped[str] = mapped_column(Text)
    sdist_uri: Mapped[str] = mapped_column(Text)
    # {"train": {"sha256": ..., "uri": ..., "rows": n}, "eval": {...}}
    datasets: Mapped[dict[str, Any]] = mapped_column(default=dict)
    dependencies: Mapped[list[Any]] = mapped_column(default=list)
    description: Mapped[str | None] = mapped_column(Text)
    readme: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=func.now())

    environment: Mapped[EnvironmentRow] = relationship(back_populates="versions")


class EvalRunRow(Base):
    """One evaluation of one environment version against one model configuration."""

    __tablename__ = "eval_runs"
    __table_args__ = (
        Index("ix_eval_runs_environment_started", "environment_name", "started_at"),
        Index("ix_eval_runs_config_fingerprint", "config_fingerprint"),
        # "the newest runs" (runs list, the cost report): a keyset walk, not a sort
        Index("ix_eval_runs_started_at_id", "started_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    environment_name: Mapped[str] = mapped_column(String(200))
    environment_version_id: Mapped[int | None] = mapped_column(
        ForeignKey("environment_versions.id", ondelete="SET NULL")
    )
    # "1.2.0" for a published version, "local+<hash12>" for unpublished code
    environment_version: Mapped[str] = mapped_column(String(80))
    environment_content_hash: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(300))
    base_url: Mapped[str | None] = mapped_column(Text)
    sampling_args: Mapped[dict[str, Any]] = mapped_column(default=dict)
    env_args: Mapped[dict[str, Any]] = mapped_column(default=dict)
    num_examples: Mapped[int]
    rollouts_per_example: Mapped[int]
    status: Mapped[str] = mapped_column(String(20), default="running")
    config_fingerprint: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[dt.datetime | None]
    summary: Mapped[dict[str, Any]] = mapped_column(default=dict)
    vfops_version: Mapped[str] = mapped_column(String(40))
    output_dir: Mapped[str | None] = mapped_column(Text)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    # e.g. ["nightly", "nightly:2026-11-29"]: which schedule produced the run
    tags: Mapped[list[Any]] = mapped_column(default=list, server_default="[]")
    # The process working on the run ("host:pid:token") and until when: see _runs.py
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires: Mapped[dt.datetime | None]
    # The run's rollouts in sum, kept by the functions that write rollouts in their own
    # transaction (_rollouts.py), so listing and costing runs never reads the rollouts
    # table, which holds a year of transcripts.
    rollouts_stored: Mapped[int] = mapped_column(default=0, server_default="0")
    rollouts_priced: Mapped[int] = mapped_column(default=0, server_default="0")
    cost_usd: Mapped[float | None] = mapped_column(Float)
    """The sum of its priced rollouts' costs; ``None`` while none is priced."""
    # Set when its rollouts' transcripts moved to Parquet in the artifact store
    # (_transcripts.py); its rollouts' ARCHIVED_COLUMNS are NULL then.
    transcripts_uri: Mapped[str | None] = mapped_column(Text)


# The per-rollout columns come from the one declaration of the rollout schema.
ROLLOUT_RECORD_COLUMNS: tuple[RolloutColumn, ...] = tuple(
    column for column in ROLLOUT_COLUMNS if not column.per_run
)
"""The rollout schema's columns stored per rollout (``model`` and ``sampling_args``
are the run's, stored once on :class:`EvalRunRow`)."""


ARCHIVED_COLUMNS: tuple[str, ...] = ("prompt", "completion")
"""The transcript columns a completed run's rollouts can hand to the artifact store
(NULL in SQL then; see :mod:`vfops.registry._transcripts`)."""


def _sql_type(column: RolloutColumn) -> Any:
    if column.kind == "int":
        return BigInteger() if column.big else Integer()
    if column.kind == "float":
        return Float()
    if column.kind == "json":
        return JSONType
    return String(column.max_length) if column.max_length is not None else Text()


def _rollouts_table() -> Table:
    return Table(
        "rollouts",
        Base.metadata,
        Column("id", BigIntPK, primary_key=True, autoincrement=True),
        Column(
            "run_id", String(32), ForeignKey("eval_runs.id", ondelete="CASCADE"), nullable=False
        ),
        *(
            Column(
                column.name,
                _sql_type(column),
                nullable=column.nullable or column.name in ARCHIVED_COLUMNS,
                server_default=(
                    None if column.stored_default is None else text(repr(column.stored_default))
                ),
            )
            for column in ROLLOUT_RECORD_COLUMNS
        ),
        # also serves "rollouts of a run by example_id"
        UniqueConstraint("run_id", "example_id", "rollout_index"),
        Index("ix_rollouts_trace_id", "trace_id"),
    )


class RolloutRow(Base):
    """One rollout of a run; (run, example_id, rollout_index) is written exactly once.

    Its columns are ``id``, ``run_id`` and :data:`ROLLOUT_RECORD_COLUMNS`, mapped from
    a table built from the declaration (read them through ``RolloutRow.__table__.c``).
    """

    __table__ = _rollouts_table()


class JudgeCacheRow(Base):
    """A judge's verdict, keyed on everything that can change it."""

    __tablename__ = "judge_cache"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    judge_model: Mapped[str] = mapped_column(String(300))
    score: Mapped[float | None] = mapped_column(Float)
    response: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=func.now())


class AliasEventRow(Base):
    """One promotion decision on a model alias: append-only, never updated or deleted.

    Refusals are recorded too, so "who was champion when, and on what evidence"
    can always be reconstructed from this table.
    """

    __tablename__ = "alias_events"
    __table_args__ = (Index("ix_alias_events_model_alias", "model_name", "alias", "id"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=func.now())
    actor: Mapped[str] = mapped_column(String(200))
    model_name: Mapped[str] = mapped_column(String(300))
    alias: Mapped[str] = mapped_column(String(100))
    # the version holding the alias before the decision (None: nobody held it)
    from_version: Mapped[str | None] = mapped_column(String(40))
    to_version: Mapped[str] = mapped_column(String(40))
    # "promoted" or "refused"
    outcome: Mapped[str] = mapped_column(String(20))
    forced: Mapped[bool] = mapped_column(Boolean)
    metric: Mapped[str] = mapped_column(String(100))
    # {"<env>": {"candidate_run_id", "holder_run_id", "delta", "verdict", ...}}
    evidence: Mapped[dict[str, Any]] = mapped_column(default=dict)
    reason: Mapped[str] = mapped_column(Text)


class CostBudgetRow(Base):
    """A spending cap and what was spent against it, shared by every process.

    ``scope`` names what the cap covers: ``run:<id>`` (``vfops eval --max-cost``),
    ``sweep:<name>`` or any name several sweeps share. ``reserved_usd`` is the sum of
    the worst-case costs of the requests in flight (:class:`CostReservationRow`).
    """

    __tablename__ = "cost_budgets"

    scope: Mapped[str] = mapped_column(String(300), primary_key=True)
    cap_usd: Mapped[float | None] = mapped_column(Float)
    spent_usd: Mapped[float] = mapped_column(Float, default=0.0)
    reserved_usd: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class CostReservationRow(Base):
    """One request's worst-case cost, held against a budget while it is in flight."""

    __tablename__ = "cost_reservations"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    scope: Mapped[str] = mapped_column(
        ForeignKey("cost_budgets.scope", ondelete="CASCADE"), primary_key=True
    )
    usd: Mapped[float] = mapped_column(Float)
    # the run whose request it is: a process that takes the run over releases them
    run_id: Mapped[str | None] = mapped_column(String(32), index=True)
    expires_at: Mapped[dt.datetime]


class EndpointPushbackRow(Base):
    """How often processes were pushed back (429s) by one endpoint: the signal adaptive
    limiters in other processes back off on (``vfops.budget.PeerSync``)."""

    __tablename__ = "endpoint_pushback"

    # the endpoint's base URL and model, never a key
    endpoint: Mapped[str] = mapped_column(String(500), primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger, default=0)
    # the reporting process's limit after its last pushback: where a newcomer starts
    limit_hint: Mapped[float | None] = mapped_column(Float)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
