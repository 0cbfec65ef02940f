"""Eval runs: one evaluation of one environment version against one model configuration.

Every function takes the caller's :class:`~sqlalchemy.orm.Session` (open one with
:func:`vfops.registry.session_scope`), so several changes are one transaction;
:func:`create_run` and :func:`list_runs` take a typed :class:`NewRun` /
:class:`RunFilter`, so a new column or filter is one field, not one more argument.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import String, cast, select, text, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from vfops._errors import VfopsError
from vfops._lease import LEASE_TTL_S, LeaseLostError, LeaseOwner, RunBusyError
from vfops._version import __version__
from vfops.registry._models import EvalRunRow, utcnow

RUN_STATUSES: Final = frozenset(
    {"running", "completed", "failed", "interrupted", "budget_exhausted"}
)
# a run in any other status can be resumed (its missing rollouts generated)
_FINISHED: Final = "completed"

STALE: Final = "stale"
"""What a run still ``running`` in the registry is shown as once nobody works on it
(:func:`shown_status`): its process is gone and its lease expired or was released."""


def _aware(moment: dt.datetime) -> dt.datetime:
    # SQLite hands back naive datetimes; every stored time is UTC
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def take_run_lease(
    session: Session, run_id: str, owner: LeaseOwner, *, ttl_s: float = LEASE_TTL_S
) -> None:
    """Make ``owner`` the one process working on ``run_id`` (in the caller's transaction).

    Compare-and-set: the UPDATE only matches while the lease is as read (free,
    expired, or held by a dead process of this host), so two processes, on any
    machines, cannot both take it. Raises :class:`RunBusyError` naming the holder.
    """
    now = utcnow()
    row = session.execute(
        select(EvalRunRow.lease_owner, EvalRunRow.lease_expires).where(EvalRunRow.id == run_id)
    ).one_or_none()
    if row is None:
        raise VfopsError(f"no eval run with id {run_id!r}")
    held_by, expires = row
    if held_by is not None and held_by != str(owner):
        holder = LeaseOwner.parse(held_by)
        if expires is not None and _aware(expires) > now and not holder.is_dead():
            raise _busy(run_id, holder, _aware(expires))
    # the lease as read (a holder that renewed meanwhile keeps it)
    owner_col, expires_col = EvalRunRow.lease_owner, EvalRunRow.lease_expires
    unchanged = (
        owner_col.is_(None) if held_by is None else owner_col == held_by,
        expires_col.is_(None) if expires is None else expires_col == expires,
    )
    # Core on the session's connection: the rowcount tells whether the CAS matched
    try:
        _bounded_lock_wait(session)
        taken = session.connection().execute(
            update(EvalRunRow)
            .where(EvalRunRow.id == run_id, *unchanged)
            .values(lease_owner=str(owner), lease_expires=now + dt.timedelta(seconds=ttl_s))
        )
    except OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
            raise
        holder = LeaseOwner.parse(held_by or "?@0:")
        raise RunBusyError(
            f"run {run_id} is being written by its holder, {holder.describe()}, right now "
            f"(or it was paused in the middle of a write); try again in a moment"
        ) from None
    if taken.rowcount != 1:  # another process took it between the read and the write
        row = session.execute(
            select(EvalRunRow.lease_owner, EvalRunRow.lease_expires).where(EvalRunRow.id == run_id)
        ).one()
        raise _busy(run_id, LeaseOwner.parse(row[0] or "?@0:"), _aware(row[1] or now))


_LOCK_NOT_AVAILABLE: Final = "55P03"
"""PostgreSQL's SQLSTATE for a lock not granted within ``lock_timeout``."""


def _bounded_lock_wait(session: Session) -> None:
    """On PostgreSQL, a takeover waits at most a few seconds for the run's row: a holder
    stopped (SIGSTOP, a frozen machine) between its fenced write and its commit keeps the
    row locked until it runs again, and the taker must not hang until then."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL lock_timeout = '5s'"))


def _busy(run_id: str, holder: LeaseOwner, expires: dt.datetime) -> RunBusyError:
    until = expires.strftime("%H:%M:%S UTC")
    return RunBusyError(
        f"run {run_id} is being worked on by {holder.describe()} (lease until {until}, "
        "renewed while it runs); wait for it to end, or if that process is gone, "
        "resume after the lease expires"
    )


def renew_run_lease(
    session: Session, run_id: str, owner: LeaseOwner, *, ttl_s: float = LEASE_TTL_S
) -> bool:
    """Extend ``owner``'s lease (in the caller's transaction); ``False`` when another
    process has taken the run over (or ``owner`` released it)."""
    result = session.connection().execute(
        update(EvalRunRow)
        .where(_held_by(run_id, owner))
        .values(lease_expires=utcnow() + dt.timedelta(seconds=ttl_s))
    )
    return bool(result.rowcount == 1)


def hold_run_lease(
    session: Session, run_id: str, owner: LeaseOwner, *, ttl_s: float = LEASE_TTL_S
) -> None:
    """The fence of every write ``owner`` makes to its run: renew its lease in the
    caller's transaction, or raise :class:`LeaseLostError` naming the process that took
    the run over (the caller's transaction is then rolled back: nothing it wrote is
    kept). Call it last in the transaction of the write, just before the commit.

    The renewal is one conditional UPDATE: on PostgreSQL it locks the run's row until
    the transaction ends (a takeover's compare-and-set waits for it, then finds the
    lease renewed), on SQLite the write transaction already excludes every other
    writer; either way the writes of a holder whose lease was taken over never commit.
    """
    if not renew_run_lease(session, run_id, owner, ttl_s=ttl_s):
        raise _lost(session, run_id, owner)


def _held_by(run_id: str, owner: LeaseOwner) -> Any:
    # a released lease (no expiry) keeps its last owner's name, but is no one's
    return (
        (EvalRunRow.id == run_id)
        & (EvalRunRow.lease_owner == str(owner))
        & EvalRunRow.lease_expires.is_not(None)
    )


def _lost(session: Session, run_id: str, owner: LeaseOwner) -> LeaseLostError:
    row = session.execute(
        select(EvalRunRow.lease_owner, EvalRunRow.lease_expires, EvalRunRow.status).where(
            EvalRunRow.id == run_id
        )
    ).one_or_none()
    me = f"this process ({owner.describe()})"
    if row is None:
        return LeaseLostError(f"run {run_id} is no longer in the registry; {me} stops")
    held_by, expires, status = row
    if held_by is None or held_by == str(owner):
        who = "another process"
    else:
        who = LeaseOwner.parse(held_by).describe()
    now = "works on it now" if expires is not None else f"ended it ({status})"
    return LeaseLostError(
        f"run {run_id} was taken over by {who}, which {now}: the lease of {me} lapsed "
        "(paused or cut off from the registry past VFOPS_LEASE_TTL_S); it wrote nothing "
        "more to the run and stops (see: vfops runs show " + run_id[:12] + ")"
    )


def release_run_lease(session: Session, run_id: str, owner: LeaseOwner) -> None:
    """End ``owner``'s lease (a lease another process took over is left alone). The
    owner's name stays, with no expiry: a holder that lost the run learns who ended it."""
    session.connection().execute(
        update(EvalRunRow).where(_held_by(run_id, owner)).values(lease_expires=None)
    )


def shown_status(run: EvalRunRow, *, now: dt.datetime | None = None) -> str:
    """``run``'s status as a reader should see it: :data:`STALE` for a run still
    ``running`` that nobody works on (no lease, its lease expired, or its holder is a
    dead process of this host: killed, out of memory, its machine gone), computed when
    read; else its status. A stale run resumes with ``vfops eval ... --resume RUN``."""
    if run.status != "running":
        return run.status
    expires = run.lease_expires
    if run.lease_owner is None or expires is None:
        return STALE
    if _aware(expires) <= (now or utcnow()) or LeaseOwner.parse(run.lease_owner).is_dead():
        return STALE
    return run.status


def _check_status(status: str) -> None:
    if status not in RUN_STATUSES:
        raise VfopsError(f"unknown run status {status!r}; use one of {sorted(RUN_STATUSES)}")


@dataclass(frozen=True)
class NewRun:
    """What a new eval run records (:func:`create_run`); a new column is one field here."""

    environment_name: str
    environment_version: str
    environment_content_hash: str
    model: str
    num_examples: int
    rollouts_per_example: int
    config_fingerprint: str
    sampling_args: dict[str, Any] | None = None
    env_args: dict[str, Any] | None = None
    base_url: str | None = None
    environment_version_id: int | None = None
    output_dir: str | None = None
    run_id: str | None = None
    """32 hex characters unless given."""
    status: str = "running"
    tags: Sequence[str] = ()
    lease_owner: LeaseOwner | None = None
    """The process that will work on the run (see :func:`take_run_lease`)."""


def create_run(session: Session, new: NewRun) -> EvalRunRow:
    """Insert the eval run ``new`` describes and return it."""
    status, lease_owner = new.status, new.lease_owner
    _check_status(status)
    run = EvalRunRow(
        id=new.run_id or uuid.uuid4().hex,
        environment_name=new.environment_name,
        environment_version_id=new.environment_version_id,
        environment_version=new.environment_version,
        environment_content_hash=new.environment_content_hash,
        model=new.model,
        base_url=new.base_url,
        sampling_args=dict(new.sampling_args or {}),
        env_args=dict(new.env_args or {}),
        num_examples=new.num_examples,
        rollouts_per_example=new.rollouts_per_example,
        status=status,
        config_fingerprint=new.config_fingerprint,
        started_at=utcnow(),
        summary={},
        vfops_version=__version__,
        output_dir=new.output_dir,
        tags=list(new.tags),
        lease_owner=None if lease_owner is None else str(lease_owner),
        lease_expires=None if lease_owner is None else utcnow() + dt.timedelta(seconds=LEASE_TTL_S),
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
    where = RunFilter(config_fingerprint=config_fingerprint, status=_FINISHED, limit=1)
    runs = list_runs(session, where)
    return runs[0] if runs else None


@dataclass(frozen=True)
class RunFilter:
    """Which runs :func:`list_runs` returns: those matching every field given (``None``:
    any), the newest first, at most ``limit`` (``None``: all)."""

    env_name: str | None = None
    limit: int | None = 50
    status: str | None = None
    model: str | None = None
    config_fingerprint: str | None = None
    num_examples: int | None = None
    rollouts_per_example: int | None = None
    environment_content_hash: str | None = None
    started_before: dt.datetime | None = None
    exclude_run_id: str | None = None


def list_runs(session: Session, where: RunFilter | None = None) -> list[EvalRunRow]:
    """The newest runs first matching ``where`` (default: the 50 newest)."""
    where = where or RunFilter()
    equal: list[tuple[Any, Any]] = [
        (EvalRunRow.environment_name, where.env_name),
        (EvalRunRow.status, where.status),
        (EvalRunRow.model, where.model),
        (EvalRunRow.config_fingerprint, where.config_fingerprint),
        (EvalRunRow.num_examples, where.num_examples),
        (EvalRunRow.rollouts_per_example, where.rollouts_per_example),
        (EvalRunRow.environment_content_hash, where.environment_content_hash),
    ]
    query = select(EvalRunRow).where(
        *(column == value for column, value in equal if value is not None)
    )
    if where.started_before is not None:
        query = query.where(EvalRunRow.started_at < where.started_before)
    if where.exclude_run_id is not None:
        query = query.where(EvalRunRow.id != where.exclude_run_id)
    order = (EvalRunRow.started_at.desc(), EvalRunRow.id.desc())
    query = query.order_by(*order).limit(where.limit)
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
    session: Session,
    run_id: str,
    status: str,
    summary: dict[str, Any] | None = None,
    *,
    lease: LeaseOwner | None = None,
) -> EvalRunRow:
    """Set the final status, the summary and ``finished_at`` of a run; with ``lease``,
    only while that lease is held (:func:`hold_run_lease`: else
    :class:`LeaseLostError`, nothing changed)."""
    _check_status(status)
    run = _require_run(session, run_id)
    if lease is not None:
        # one conditional UPDATE, the fence and the end together: the row is locked only
        # until the commit, and nothing changes unless the lease is held
        ended = session.connection().execute(
            update(EvalRunRow)
            .where(_held_by(run_id, lease))
            .values(
                status=status,
                summary=dict(summary or {}),
                finished_at=utcnow(),
                lease_expires=utcnow() + dt.timedelta(seconds=LEASE_TTL_S),
            )
        )
        if ended.rowcount != 1:
            raise _lost(session, run_id, lease)
        session.refresh(run)
        return run
    run.status = status
    run.summary = dict(summary or {})
    run.finished_at = utcnow()
    session.flush()
    return run


def run_model(session: Session, run_id: str) -> tuple[str, dict[str, Any]]:
    """The model and sampling arguments of a run (what its rollouts share)."""
    row = session.execute(
        select(EvalRunRow.model, EvalRunRow.sampling_args).where(EvalRunRow.id == run_id)
    ).one_or_none()
    if row is None:
        raise VfopsError(f"no eval run with id {run_id!r}")
    return row[0], row[1]


def set_mlflow_run_id(session: Session, run_id: str, mlflow_run_id: str) -> None:
    """Link a registry run to its MLflow run."""
    run = _require_run(session, run_id)
    run.mlflow_run_id = mlflow_run_id


def add_run_tags(session: Session, run_id: str, tags: Sequence[str]) -> list[str]:
    """Append the ``tags`` a run lacks (who worked on it; not part of its identity, which
    is the configuration fingerprint); returns the run's tags."""
    run = _require_run(session, run_id)
    current = [str(tag) for tag in run.tags or []]
    missing = [tag for tag in dict.fromkeys(tags) if tag not in current]
    if missing:
        run.tags = [*current, *missing]  # a new list: the JSON column sees the change
    return [*current, *missing]


def runs_tagged(session: Session, tag: str) -> list[EvalRunRow]:
    """The runs carrying ``tag``, newest first (a text match narrows, Python decides: JSON
    containment is spelled differently by each dialect)."""
    pattern = "%" + tag.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    query = (
        select(EvalRunRow)
        .where(cast(EvalRunRow.tags, String).like(pattern, escape="\\"))
        .order_by(EvalRunRow.started_at.desc(), EvalRunRow.id.desc())
    )
    return [run for run in session.scalars(query) if tag in (run.tags or [])]
