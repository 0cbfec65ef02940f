"""Eval runs: one evaluation of one environment version against one model configuration."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from vfops._errors import VfopsError
from vfops._version import __version__
from vfops.registry._db import transaction
from vfops.registry._models import EvalRunRow, utcnow

RUN_STATUSES: Final = frozenset({"running", "completed", "failed", "interrupted"})
# a run in any other status can be resumed (its missing rollouts generated)
_FINISHED: Final = "completed"


def _check_status(status: str) -> None:
    if status not in RUN_STATUSES:
        raise VfopsError(f"unknown run status {status!r}; use one of {sorted(RUN_STATUSES)}")


def create_run(
    session: Session,
    *,
    environment_name: str,
    environment_version: str,
    environment_content_hash: str,
    model: str,
    num_examples: int,
    rollouts_per_example: int,
    config_fingerprint: str,
    sampling_args: dict[str, Any] | None = None,
    env_args: dict[str, Any] | None = None,
    base_url: str | None = None,
    environment_version_id: int | None = None,
    output_dir: str | None = None,
    run_id: str | None = None,
    status: str = "running",
    tags: Sequence[str] = (),
) -> EvalRunRow:
    """Insert a new eval run (id: 32 hex characters unless given) and return it."""
    _check_status(status)
    run = EvalRunRow(
        id=run_id or uuid.uuid4().hex,
        environment_name=environment_name,
        environment_version_id=environment_version_id,
        environment_version=environment_version,
        environment_content_hash=environment_content_hash,
        model=model,
        base_url=base_url,
        sampling_args=dict(sampling_args or {}),
        env_args=dict(env_args or {}),
        num_examples=num_examples,
        rollouts_per_example=rollouts_per_example,
        status=status,
        config_fingerprint=config_fingerprint,
        started_at=utcnow(),
        summary={},
        vfops_version=__version__,
        output_dir=output_dir,
        tags=list(tags),
    )
    session.add(run)
    session.flush()
    return run


def get_run(session: Session, run_id: str, *, exact: bool = False) -> EvalRunRow | None:
    """The run with id ``run_id``, or (unless ``exact``) the only run whose id starts with it.

    Raises :class:`VfopsError` when the prefix matches several runs.
    """
    if not run_id:
        return None
    run = session.get(EvalRunRow, run_id)
    if run is not None or exact:
        return run
    matches = list(
        session.scalars(
            select(EvalRunRow).where(EvalRunRow.id.startswith(run_id, autoescape=True)).limit(2)
        )
    )
    if len(matches) > 1:
        raise VfopsError(f"run id prefix {run_id!r} matches several runs; give more characters")
    return matches[0] if matches else None


def _require_run(session: Session, run_id: str) -> EvalRunRow:
    run = session.get(EvalRunRow, run_id)
    if run is None:
        raise VfopsError(f"no eval run with id {run_id!r}")
    return run


def find_resumable_run(session: Session, config_fingerprint: str) -> EvalRunRow | None:
    """The newest unfinished run with this configuration (status other than completed)."""
    return session.scalar(
        select(EvalRunRow)
        .where(EvalRunRow.config_fingerprint == config_fingerprint, EvalRunRow.status != _FINISHED)
        .order_by(EvalRunRow.started_at.desc(), EvalRunRow.id.desc())
        .limit(1)
    )


def find_completed_run(session: Session, config_fingerprint: str) -> EvalRunRow | None:
    """The newest completed run with this configuration."""
    runs = list_runs(session, config_fingerprint=config_fingerprint, status=_FINISHED, limit=1)
    return runs[0] if runs else None


def list_runs(
    session: Session,
    env_name: str | None = None,
    limit: int | None = 50,
    *,
    status: str | None = None,
    model: str | None = None,
    config_fingerprint: str | None = None,
    num_examples: int | None = None,
    rollouts_per_example: int | None = None,
    environment_content_hash: str | None = None,
    started_before: dt.datetime | None = None,
    exclude_run_id: str | None = None,
) -> list[EvalRunRow]:
    """The newest runs first (at most ``limit``; None: all) matching every filter given."""
    equal: list[tuple[Any, Any]] = [
        (EvalRunRow.environment_name, env_name),
        (EvalRunRow.status, status),
        (EvalRunRow.model, model),
        (EvalRunRow.config_fingerprint, config_fingerprint),
        (EvalRunRow.num_examples, num_examples),
        (EvalRunRow.rollouts_per_example, rollouts_per_example),
        (EvalRunRow.environment_content_hash, environment_content_hash),
    ]
    query = select(EvalRunRow).where(
        *(column == value for column, value in equal if value is not None)
    )
    if started_before is not None:
        query = query.where(EvalRunRow.started_at < started_before)
    if exclude_run_id is not None:
        query = query.where(EvalRunRow.id != exclude_run_id)
    query = query.order_by(EvalRunRow.started_at.desc(), EvalRunRow.id.desc()).limit(limit)
    return list(session.scalars(query))


def set_run_status(session: Session, run_id: str, status: str) -> EvalRunRow:
    """Change a run's status (e.g. ``"running"`` again when it is resumed)."""
    _check_status(status)
    run = _require_run(session, run_id)
    run.status = status
    if status == "running":
        run.finished_at = None
    session.flush()
    return run


def finish_run(
    session: Session, run_id: str, status: str, summary: dict[str, Any] | None = None
) -> EvalRunRow:
    """Set the final status, the summary and ``finished_at`` of a run."""
    _check_status(status)
    run = _require_run(session, run_id)
    run.status = status
    run.summary = dict(summary or {})
    run.finished_at = utcnow()
    session.flush()
    return run


def run_model(engine: Engine, run_id: str) -> tuple[str, dict[str, Any]]:
    """The model and sampling arguments of a run (what its rollouts share)."""
    with transaction(engine, write=False) as connection:
        row = connection.execute(
            select(EvalRunRow.model, EvalRunRow.sampling_args).where(EvalRunRow.id == run_id)
        ).one_or_none()
    if row is None:
        raise VfopsError(f"no eval run with id {run_id!r}")
    return row[0], row[1]


def set_mlflow_run_id(engine: Engine, run_id: str, mlflow_run_id: str) -> None:
    """Link a registry run to its MLflow run (one short write transaction)."""
    from vfops.registry._db import session_scope

    with session_scope(engine) as session:
        run = _require_run(session, run_id)
        run.mlflow_run_id = mlflow_run_id
