"""Finishing a run: every sink closed, the end recorded in the folder, the registry and MLflow.

However the run ended (completed, a sink failed, the evaluation raised, it was
cancelled), its end is recorded: the sinks are closed (each failure recorded, none
swallowed), then ``metadata.json``, the registry and MLflow, in that order, and the
run's lease is released last; a run is never left ``running`` with rows missing, even
when the task is cancelled again meanwhile (:func:`settled`). Every registry write is
fenced by the lease: a process that lost the run to another writes none of this.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Sequence
from functools import partial
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
from vfops.registry import RegistryUnavailable

if TYPE_CHECKING:
    from vfops._lease import LeaseOwner
    from vfops.costs import BudgetExhausted
    from vfops.evaluation._open_run import Plan
    from vfops.registry import RunStore
    from vfops.stats import EvalSummary


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


async def opened_registry(opening: asyncio.Task[RunStore]) -> RunStore | None:
    """The registry of a run opened in the background, or None when opening it failed
    (the registry sink, which waited for the same task, reports why)."""
    await asyncio.wait({opening})
    return None if opening.cancelled() or opening.exception() is not None else opening.result()


def add_provenance(metadata: dict[str, Any], plan: Plan) -> None:
    from vfops.sandbox import sandboxes_used  # light: what this process's sandboxes ran on

    sandboxes = sandboxes_used()
    if sandboxes:  # the engine, image (and its digest) and limits model-written code met
        metadata["sandboxes"] = sandboxes
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
    registry: RunStore | None,
) -> EvalResult:
    """Close every sink (each failure recorded, none swallowed), then record the end: in
    the registry, in MLflow (waiting until it has everything), in ``metadata.json``.

    Every registry write of the end is fenced by the run's lease, held until the last
    one: a process that lost the run to another (paused or cut off past its lease)
    writes nothing more, stops its tracker without touching the MLflow run, and raises
    :class:`~vfops._lease.LeaseLostError` (exit 4) naming the new holder. MLflow is
    told how the run ended only once the registry recorded it."""
    from vfops._lease import LeaseLostError

    finish = RunFinish(status=status, summary=summary, error=error)
    for sink in sinks:
        try:
            await sink.close(finish)
        except SinkError as exc:
            finish.status, finish.error = "failed", finish.error or str(exc)
        except Exception as exc:
            problem = f"{sink.name}: {first_line(exc)}"
            finish.status, finish.error = "failed", finish.error or resume_hint(plan, problem)
    try:
        mlflow_run_id = await _record(plan, sinks, tracking_sink, metadata, finish, registry)
    except LeaseLostError:
        if tracking_sink is not None:
            tracking_sink.abandon()  # the new holder's tracker ends the MLflow run
        raise
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


async def _record(
    plan: Plan,
    sinks: Sequence[Sink],
    tracking_sink: TrackingSink | None,
    metadata: dict[str, Any],
    finish: RunFinish,
    registry: RunStore | None,
) -> str | None:
    """Record ``finish`` in the folder, the registry and MLflow; the MLflow run's id."""
    registry_sink = next((s for s in sinks if isinstance(s, RegistrySink)), None)
    run_id, lease = plan.run_id, plan.lease
    if registry is None or run_id is None:
        _end_metadata(plan, metadata, finish)
        return None
    down = registry_sink is not None and registry_sink.gave_up
    if lease is not None and not down:
        # still this run's holder? (else the folder, the registry and MLflow are left
        # to the process that took it over)
        await _still_held(registry, run_id, lease)
    # the folder first: one that cannot say how the run ended (a full disk) fails it
    # before the registry and MLflow record it as anything else
    _end_metadata(plan, metadata, finish)
    recorded = await _record_end(registry, run_id, finish, lease, registry_sink)
    mlflow_run_id = None
    if tracking_sink is not None and recorded:
        if finish.status == "completed":
            finish.extra["rollouts_file"] = str(plan.run_dir / ARROW_FILE)
        try:
            await tracking_sink.close(finish)
            mlflow_run_id = tracking_sink.mlflow_run_id
        except SinkError as exc:
            if finish.status == "completed":  # else the first problem stays the news
                finish.status, finish.error = "failed", str(exc)
                await _record_end(registry, run_id, finish, lease)
        except RegistryUnavailable as exc:  # MLflow has the end; the link was not stored
            finish.status, finish.error = "failed", finish.error or _registry_down(run_id, exc)
    # not recorded (the registry did not answer): MLflow is not told an end the registry
    # lacks; the tracker ends its run as killed when its input closes, --resume finishes
    if mlflow_run_id is not None or finish.status != metadata["status"]:
        if mlflow_run_id is not None:
            metadata["mlflow_run_id"] = mlflow_run_id
        status_before = finish.status
        _end_metadata(plan, metadata, finish)
        if finish.status != status_before:
            await _record_end(registry, run_id, finish, lease)
    if lease is not None:
        await _release(registry, run_id, lease)
    return mlflow_run_id


async def _still_held(registry: RunStore, run_id: str, lease: LeaseOwner) -> None:
    """Raise :class:`~vfops._lease.LeaseLostError` when another process took the run
    over. Any other failure is met again, and reported, by the end's (fenced) write."""
    from vfops._lease import LeaseLostError

    try:
        await registry.hold_lease(run_id, lease)
    except LeaseLostError:
        raise
    except Exception:
        return


async def _release(registry: RunStore, run_id: str, lease: LeaseOwner) -> None:
    """The run free for the next process at once. Best effort: the end is recorded
    already, and a lease that is not released expires (LEASE_TTL_S)."""
    with contextlib.suppress(Exception):
        await registry.release_lease(run_id, lease)


def _registry_down(run_id: str, exc: RegistryUnavailable) -> str:
    return (
        f"registry: {exc}; bring it back (VFOPS_DATABASE_URL), then finish the run with "
        f"vfops eval ... --resume {run_id}"
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
    registry: RunStore,
    run_id: str,
    finish: RunFinish,
    lease: LeaseOwner | None,
    registry_sink: RegistrySink | None = None,
) -> bool:
    """Record the end in the registry, fenced by ``lease`` (retried while the database
    does not answer, unless the run failed because it did not: then once); whether it
    was recorded. :class:`~vfops._lease.LeaseLostError` is raised as it is."""
    from vfops._lease import LeaseLostError

    stored = finish.summary.to_dict()
    if finish.error:
        stored["error"] = finish.error
    write = partial(registry.record_end, run_id, finish.status, stored, lease)
    try:
        if registry_sink is not None and not registry_sink.gave_up:
            await registry_sink.retrying(write)
        else:
            await write()
    except LeaseLostError:
        raise
    except Exception as exc:
        # The registry itself is down: the folder says failed; --resume fixes both.
        finish.status = "failed"
        if finish.error is None and isinstance(exc, RegistryUnavailable):
            finish.error = _registry_down(run_id, exc)
        finish.error = finish.error or (
            f"registry: could not record the end of run {run_id} ({first_line(exc)}); "
            f"fix the database, then finish the run with vfops eval ... --resume {run_id}"
        )
        return False
    return True
