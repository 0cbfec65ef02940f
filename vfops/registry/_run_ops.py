"""The registry service's operations (:data:`OPERATIONS`): each ``op(engine, *args)`` is
one short transaction, takes and returns plain values, and is called by name
(:class:`vfops.registry.RunStore`, the budget's ledger and pushback sync). Loaded only
where the service runs: it imports SQLAlchemy through the registry's modules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from vfops._errors import VfopsError
from vfops.registry._costs import (
    CostBudget,
    release_run_reservations,
    reserve_cost,
    set_cost_caps,
    settle_cost,
)
from vfops.registry._db import session_scope
from vfops.registry._environments import find_version
from vfops.registry._pushback import bump_pushback, read_pushback
from vfops.registry._rollouts import completed_keys, insert_rollouts, iter_rollouts
from vfops.registry._run_store import OpenAction, RunOpened, RunOpening, run_fingerprint
from vfops.registry._runs import (
    NewRun,
    create_run,
    find_completed_run,
    find_resumable_run,
    finish_run,
    get_run,
    hold_run_lease,
    release_run_lease,
    renew_run_lease,
    set_mlflow_run_id,
    set_run_status,
    take_run_lease,
)
from vfops.stats import EvalSummary

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

    from vfops._lease import LeaseOwner
    from vfops._rollout import RolloutRecord
    from vfops.registry._models import EvalRunRow


# ---------------------------------------------------------------------------- a run


def open_run(engine: Engine, opening: RunOpening) -> RunOpened:
    """Create, resume or reuse ``opening``'s run (see :class:`RunOpening`), taking its
    lease for ``opening.pid``; one transaction."""
    from vfops._lease import LeaseOwner

    code = opening.code
    with session_scope(engine) as session:
        row = find_version(session, code.env_name, code_hash=code.code_hash)
        version, version_id = (row.version, row.id) if row is not None else (code.local_label, None)
        fingerprint = run_fingerprint(opening.identity, version, code)
        lease = LeaseOwner.for_process(opening.pid)
        found = None
        run_id, run_dir = opening.run_id, opening.run_dir
        if opening.resume is not None:
            found = _resumed(session, opening, fingerprint)
            if found is None:  # killed before it was recorded: its folder holds the run
                run_id, run_dir = str(opening.resume_run_id), opening.resume
        elif opening.existing != "new":
            found = find_resumable_run(session, fingerprint)
            if found is None and opening.existing == "reuse":
                found = find_completed_run(session, fingerprint)
            if found is not None and found.status == "completed":
                where = found.output_dir or opening.output_root
                return RunOpened("reused", found.id, where, version, version_id, None)
        if found is None:
            _create(session, opening, fingerprint, (run_id, run_dir), (version, version_id), lease)
            action: OpenAction = "created" if opening.resume is None else "resumed"
            # recorded late (resumed from its folder): the folder holds its earlier work
            from_folder = opening.resume is not None
            return RunOpened(
                action, run_id, run_dir, version, version_id, lease, resume_folder=from_folder
            )
        run_dir = _take_over(session, opening, found, lease)
        done = frozenset(completed_keys(session, found.id))
        return RunOpened(
            "resumed",
            found.id,
            run_dir,
            version,
            version_id,
            lease,
            done,
            (Path(run_dir) / "metadata.json").exists(),
        )


def _resumed(session: Session, opening: RunOpening, fingerprint: str) -> EvalRunRow | None:
    """The run ``--resume`` names (None: never recorded, and its folder is given)."""
    resume = str(opening.resume)
    found = get_run(session, str(opening.resume_run_id))
    if found is None and Path(resume).is_dir():
        return None
    if found is None:
        raise VfopsError(
            f"no eval run {resume!r} in the registry; see: vfops runs list (a run "
            "stopped before it was recorded resumes from its folder: --resume RUN_DIR)"
        )
    if found.config_fingerprint != fingerprint:
        raise VfopsError(
            f"cannot resume run {found.id}: its environment version, model or settings "
            f"differ from this command ({found.environment_name}@"
            f"{found.environment_version}, model {found.model}); rerun with the same ones"
        )
    return found


def _create(
    session: Session,
    opening: RunOpening,
    fingerprint: str,
    where: tuple[str, str],
    version: tuple[str, int | None],
    lease: LeaseOwner,
) -> None:
    code = opening.code
    run = create_run(
        session,
        NewRun(
            environment_name=code.env_name,
            environment_version=version[0],
            environment_content_hash=code.code_hash,
            environment_version_id=version[1],
            model=opening.model,
            base_url=opening.base_url,
            sampling_args=opening.sampling_args,
            env_args=opening.env_args,
            num_examples=opening.num_examples,
            rollouts_per_example=opening.rollouts_per_example,
            config_fingerprint=fingerprint,
            # a run of another library's environment carries that library's version
            tags=[*opening.tags, *([code.library_label] if code.library_label else [])],
            run_id=where[0],
            lease_owner=lease,
        ),
    )
    run.output_dir = where[1]


def _take_over(session: Session, opening: RunOpening, found: EvalRunRow, lease: LeaseOwner) -> str:
    """Take the lease of a run to resume (refused, naming the holder, before anything
    changes: one process per run); the folder it continues in."""
    from vfops._folder_lock import LOCK_FILE, RunFolderLock

    resume = opening.resume
    moved = resume is not None and Path(resume).is_dir()
    if moved:
        run_dir = str(resume)
    elif found.output_dir:
        run_dir = found.output_dir
    else:
        run_dir = resume or opening.output_root
    take_run_lease(session, found.id, lease)  # a live holder's: refused, named
    # In the same transaction, so that a refusal rolls the takeover back: a process
    # paused past its lease (Ctrl-Z, SIGSTOP) keeps its folder's lock, and would
    # otherwise lose the run to a resume that can only be refused.
    if (Path(run_dir) / LOCK_FILE).exists():
        probe = RunFolderLock(Path(run_dir))
        probe.acquire()
        probe.release()
    set_run_status(session, found.id, "running")
    if moved:
        # the folder given, wherever it is now (moved off a full disk, another host's
        # copy): the run's files are there from now on
        found.output_dir = run_dir
    return run_dir


def insert(
    engine: Engine, run_id: str, records: list[RolloutRecord], lease: LeaseOwner | None = None
) -> int:
    """The rows, fenced by the run's ``lease`` (none stored once another process took
    the run over: :class:`vfops._lease.LeaseLostError`)."""
    with session_scope(engine) as session:
        inserted = insert_rollouts(session, run_id, records)
        if lease is not None:  # last: the run's row is locked only until the commit
            hold_run_lease(session, run_id, lease)
        return inserted


def renew_lease(engine: Engine, run_id: str, lease: LeaseOwner) -> bool:
    with session_scope(engine) as session:
        return renew_run_lease(session, run_id, lease)


def hold_lease(engine: Engine, run_id: str, lease: LeaseOwner) -> None:
    with session_scope(engine) as session:
        hold_run_lease(session, run_id, lease)


def release_lease(engine: Engine, run_id: str, lease: LeaseOwner) -> None:
    with session_scope(engine) as session:
        release_run_lease(session, run_id, lease)


def record_end(
    engine: Engine, run_id: str, status: str, summary: dict[str, Any], lease: LeaseOwner | None
) -> None:
    """The run's end, only while ``lease`` is held (the lease stays held: released after
    the end's last write)."""
    with session_scope(engine) as session:
        finish_run(session, run_id, status, summary, lease=lease)


def link_mlflow(engine: Engine, run_id: str, mlflow_run_id: str) -> None:
    """Store the MLflow run id on the registry run (the link back is the MLflow tag)."""
    with session_scope(engine) as session:
        set_mlflow_run_id(session, run_id, mlflow_run_id)


def run_record(engine: Engine, run_id: str) -> dict[str, Any]:
    """Registry run ``run_id`` as plain values (no base URL, no keys): its identity,
    configuration, status, summary, tags, MLflow run id, and ``published_datasets``: the
    dataset snapshots of the published version it evaluated with its default arguments
    (the rows it read), else None."""
    with session_scope(engine, write=False) as session:
        row = get_run(session, run_id)
        if row is None:
            raise VfopsError(f"no eval run {run_id!r} in the registry; see: vfops runs list")
        datasets = None
        if row.environment_version_id is not None and not row.env_args:
            version = find_version(session, row.environment_name, row.environment_version)
            if version is not None and version.id == row.environment_version_id:
                datasets = dict(version.datasets or {})
        return {
            "id": row.id,
            "env_name": row.environment_name,
            "env_version": row.environment_version,
            "code_hash": row.environment_content_hash,
            "published": row.environment_version_id is not None,
            "model": row.model,
            "sampling_args": dict(row.sampling_args or {}),
            "env_args": dict(row.env_args or {}),
            "num_examples": row.num_examples,
            "rollouts_per_example": row.rollouts_per_example,
            "status": row.status,
            "started_at": row.started_at,
            "finished_at": row.finished_at,
            "summary": dict(row.summary or {}),
            "vfops_version": row.vfops_version,
            "tags": list(row.tags or []),
            "mlflow_run_id": row.mlflow_run_id,
            "published_datasets": datasets,
        }


def run_summary(engine: Engine, run_id: str, pass_threshold: float = 1.0) -> EvalSummary:
    """Statistics of every rollout of a run stored in the registry."""
    summary = EvalSummary(pass_threshold=pass_threshold)
    with session_scope(engine, write=False) as session:
        for record in iter_rollouts(session, run_id):
            summary.add(record, new=False)
    return summary


def stored_rollouts(engine: Engine, run_id: str, keys: set[tuple[int, int]]) -> list[RolloutRecord]:
    with session_scope(engine, write=False) as session:
        return [record for record in iter_rollouts(session, run_id) if record.key in keys]


# ------------------------------------------------------------- costs and pushbacks


def set_caps(engine: Engine, caps: dict[str, float | None], run_id: str | None) -> None:
    """Create or update the caps and release ``run_id``'s stale reservations (its
    earlier process's: this one holds the run's lease now); one transaction."""
    with session_scope(engine) as session:
        set_cost_caps(session, caps)
        if run_id is not None:
            release_run_reservations(session, run_id)


def reserve(
    engine: Engine, reservation: str, scopes: Sequence[str], usd: float, run_id: str | None
) -> CostBudget | None:
    """Reserve ``usd`` on every scope at once; the first full one (nothing reserved) or None."""
    try:
        with session_scope(engine) as session:
            full = reserve_cost(session, reservation, scopes, usd, run_id=run_id)
            if full is not None:
                raise _Refused(full)  # rolls back what other scopes took
    except _Refused as refused:
        return refused.budget
    return None


class _Refused(Exception):
    def __init__(self, budget: CostBudget) -> None:
        self.budget = budget


def settle(engine: Engine, reservation: str, scopes: Sequence[str], actual_usd: float) -> None:
    with session_scope(engine) as session:
        settle_cost(session, reservation, scopes, actual_usd)


def pushback_state(engine: Engine, endpoint: str) -> tuple[int, float | None, float | None]:
    """(epoch, limit hint, POSIX time of the last pushback): plain values, so the
    evaluating process never imports the registry to read them."""
    with session_scope(engine, write=False) as session:
        state = read_pushback(session, endpoint)
    updated = None if state.updated_at is None else state.updated_at.timestamp()
    return state.epoch, state.limit_hint, updated


def pushback_bump(engine: Engine, endpoint: str, limit: float | None) -> int:
    with session_scope(engine) as session:
        return bump_pushback(session, endpoint, limit)


OPERATIONS: Final[dict[str, Callable[..., Any]]] = {
    "run.open": open_run,
    "run.insert": insert,
    "run.renew_lease": renew_lease,
    "run.hold_lease": hold_lease,
    "run.release_lease": release_lease,
    "run.record_end": record_end,
    "run.link_mlflow": link_mlflow,
    "run.record": run_record,
    "run.summary": run_summary,
    "run.rollouts": stored_rollouts,
    "cost.set_caps": set_caps,
    "cost.reserve": reserve,
    "cost.settle": settle,
    "pushback.state": pushback_state,
    "pushback.bump": pushback_bump,
}
"""Every operation the registry service runs, by name: nothing else crosses its pipe."""
