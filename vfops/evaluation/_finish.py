"""Finishing a run: every sink closed, the end recorded in the folder, the registry and MLflow.

However the run ended (completed, a sink failed, the evaluation raised, it was
cancelled), its end is recorded: the sinks are closed (each failure recorded, none
swallowed), then ``metadata.json``, the registry (releasing the run's lease) and
MLflow, in that order; a run is never left ``running`` with rows missing, even when
the task is cancelled again meanwhile (:func:`settled`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from vfops.evaluation._result import EvalResult
from vfops.evaluation._runner import now_iso
from vfops.evaluation._sinks import (
    RegistrySink,
    RunFinish,
    Sink,
    SinkError,
    TrackingSink,
    first_line,
)
from vfops.evaluation._store import ARROW_FILE, DiskWriteError, write_metadata

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from vfops._lease import LeaseOwner
    from vfops.costs import BudgetExhausted
    from vfops.evaluation._open_run import Plan
    from vfops.evaluation._registry_calls import RegistryCalls
    from vfops.stats._summary import EvalSummary


async def settled(settle: Coroutine[Any, Any, EvalResult]) -> EvalResult:
    """Record the run's end however often this task is cancelled meanwhile (a second
    Ctrl-C, SIGTERM after SIGINT): it is never left ``running`` with rows missing. A
    cancellation that came while a run that was not interrupted ended is dropped: the
    run finished, and its result says how."""
    settling = asyncio.ensure_future(settle)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(settling)
            break
        except asyncio.CancelledError:
            if settling.done() and settling.cancelled():
                raise
            cancelled = True
    task = asyncio.current_task()
    if cancelled and task is not None:
        task.uncancel()
        if result.status == "interrupted":
            raise asyncio.CancelledError
    return result


async def opened_registry(opening: asyncio.Task[RegistryCalls]) -> RegistryCalls | None:
    """The registry of a run opened in the background, or None when opening it failed
    (the registry sink, which waited for the same task, reports why)."""
    await asyncio.wait({opening})
    return None if opening.cancelled() or opening.exception() is not None else opening.result()


def add_provenance(metadata: dict[str, Any], plan: Plan) -> None:
    if plan.provenance is not None:
        metadata.update(
            env_version=plan.provenance.version, env_code_hash=plan.provenance.code_hash
        )
        if plan.provenance.library_label is not None:
            metadata["env_library"] = plan.provenance.library_label


def budget_hint(plan: Plan, exc: BudgetExhausted, planned: int) -> str:
    label = plan.run_id or plan.run_dir
    return (
        f"{exc}; the run {label} stopped (planned {planned} rollouts); continue it with "
        f"vfops eval ... --resume {label} and a higher --max-cost (or none)"
    )


def resume_hint(plan: Plan, problem: str) -> str:
    label = plan.run_id or plan.run_dir
    return f"{problem}; fix it, then finish the run with vfops eval ... --resume {label}"


async def finish_run(
    plan: Plan,
    sinks: Sequence[Sink],
    tracking_sink: TrackingSink | None,
    summary: EvalSummary,
    metadata: dict[str, Any],
    status: str,
    error: str | None,
    *,
    registry: RegistryCalls | None,
) -> EvalResult:
    """Close every sink (each failure recorded, none swallowed), then record the end: in
    the registry, in MLflow (waiting until it has everything), in ``metadata.json``."""
    finish = RunFinish(status=status, summary=summary, error=error)
    for sink in sinks:
        try:
            await sink.close(finish)
        except SinkError as exc:
            finish.status, finish.error = "failed", finish.error or str(exc)
        except Exception as exc:
            problem = f"{sink.name}: {first_line(exc)}"
            finish.status, finish.error = "failed", finish.error or resume_hint(plan, problem)
    registry_sink = next((s for s in sinks if isinstance(s, RegistrySink)), None)
    recorded = registry is not None and plan.run_id is not None
    # the folder first: one that cannot say how the run ended (a full disk) fails it
    # before the registry and MLflow record it as anything else
    _end_metadata(plan, metadata, finish)
    if recorded:
        assert registry is not None and plan.run_id is not None
        await _record_end(registry, plan.run_id, finish, summary, plan.lease, registry_sink)
    mlflow_run_id = None
    if tracking_sink is not None and recorded:
        assert registry is not None and plan.run_id is not None
        if finish.status == "completed":
            finish.extra["rollouts_file"] = str(plan.run_dir / ARROW_FILE)
        try:
            await tracking_sink.close(finish)
            mlflow_run_id = tracking_sink.mlflow_run_id
        except SinkError as exc:
            if finish.status == "completed":  # else the first problem stays the news
                finish.status, finish.error = "failed", str(exc)
                await _record_end(registry, plan.run_id, finish, summary)
    if mlflow_run_id is not None or finish.status != metadata["status"]:
        if mlflow_run_id is not None:
            metadata["mlflow_run_id"] = mlflow_run_id
        status_before = finish.status
        _end_metadata(plan, metadata, finish)
        if finish.status != status_before and recorded:
            assert registry is not None and plan.run_id is not None
            await _record_end(registry, plan.run_id, finish, summary)
    return EvalResult(
        run_dir=plan.run_dir,
        summary=summary,
        status=finish.status,
        metadata=metadata,
        run_id=plan.run_id,
        action=plan.action,
        mlflow_run_id=mlflow_run_id,
        error=finish.error,
    )


def _end_metadata(plan: Plan, metadata: dict[str, Any], finish: RunFinish) -> None:
    """``metadata.json`` with the run's end; a folder that cannot take it fails the run."""
    metadata.update(
        status=finish.status,
        finished_at=now_iso(),
        summary=finish.summary.to_dict(),
        error=finish.error,
    )
    try:
        write_metadata(plan.run_dir, metadata)
    except DiskWriteError as exc:
        finish.status = metadata["status"] = "failed"
        finish.error = finish.error or (
            f"run folder: {exc}; free space there, then finish the run with vfops eval ... "
            f"--resume {plan.run_id or plan.run_dir}"
        )


async def _record_end(
    registry: RegistryCalls,
    run_id: str,
    finish: RunFinish,
    summary: EvalSummary,
    lease: LeaseOwner | None = None,
    registry_sink: RegistrySink | None = None,
) -> None:
    """Record the end in the registry (retried while the database does not answer,
    unless the run failed because it did not: then once)."""
    stored = summary.to_dict()
    if finish.error:
        stored["error"] = finish.error
    args = (run_id, finish.status, stored, lease)
    try:
        if registry_sink is not None and not registry_sink.gave_up:
            await registry_sink.retrying(registry, _write_end, *args)
        else:
            await registry.call(_write_end, *args)
    except Exception as exc:
        # The registry itself is down: the folder says failed; --resume fixes both.
        finish.status = "failed"
        finish.error = finish.error or (
            f"registry: could not record the end of run {run_id} ({first_line(exc)}); "
            f"fix the database, then finish the run with vfops eval ... --resume {run_id}"
        )


def _write_end(
    engine: Engine, run_id: str, status: str, stored: dict[str, Any], lease: LeaseOwner | None
) -> None:
    """The run's end and, with its ``lease``, the run free for the next process at once."""
    from vfops.registry import finish_run, release_run_lease, session_scope

    with session_scope(engine) as session:
        finish_run(session, run_id, status, stored)
        if lease is not None:
            release_run_lease(session, run_id, lease)
