"""Running an opened run: its folder locked, every scored group to the folder, then the sinks.

Each scored group goes to the run folder first (what is on disk survives a crash;
``--resume`` rebuilds every other sink from it), then to every sink, the run's own
(:func:`~vfops.evaluation._default_sinks.open_sinks`: vfops's own, the caller's, the
named ones). On
resume the records on disk, and those only the registry holds, are sent on first
(:func:`_catch_up`, :func:`_copy_from_registry`), so nothing completed is
regenerated. However the rollouts end, the run is finished
(:mod:`vfops.evaluation._finish`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vfops._errors import VfopsError
from vfops._folder_lock import RunFolderLock
from vfops._image_map import image_map_scope
from vfops._rollout import RolloutRecord
from vfops._rollout_scope import run_scope
from vfops.costs import BudgetExhausted
from vfops.evaluation._default_sinks import DefaultSinks, Recording, open_sinks
from vfops.evaluation._finish import (
    add_provenance,
    budget_hint,
    finish_run,
    opened_registry,
    resume_hint,
    settled,
)
from vfops.evaluation._result import EvalProgress, EvalResult, OpenedRun
from vfops.evaluation._runner import check_resumable, initial_metadata, run_rollouts
from vfops.evaluation._sinks import RegistrySink, Sink, SinkError, first_line
from vfops.evaluation._store import DiskWriteError, RolloutWriter, iter_records, write_metadata
from vfops.stats import EvalSummary
from vfops.tracking import wait_for_tracker

if TYPE_CHECKING:
    from vfops.clients import ModelClient
    from vfops.envs import Environment
    from vfops.evaluation._open_run import Plan
    from vfops.registry import RunStore
    from vfops.tracking import Tracker

_CATCH_UP_BATCH = 512


@dataclass
class RunContext:
    """Everything running an opened run needs, in one object (not threaded argument by
    argument): the environment, the client, the plan, and where its rollouts go."""

    env: Environment
    client: ModelClient
    plan: Plan
    planned: int
    """Rollouts the run will hold when complete."""
    registry: RunStore | None
    """The registry, when the run was opened before running (else ``opening``)."""
    opening: asyncio.Task[RunStore] | None
    """A new run being recorded in the registry while its first rollouts run."""
    tracker: Tracker | None = None
    mlflow_parent_run_id: str | None = None
    progress: EvalProgress | None = None
    extra_sinks: Sequence[Sink] = ()
    """The caller's sinks, after the run's own (``evaluate_async(..., sinks=...)``)."""
    plugin_sinks: Sequence[str] = ()
    """Sinks named by the caller (``vfops.eval_sinks`` entry points), after those."""


async def run(context: RunContext) -> EvalResult:
    """Run the opened run in its locked folder; refused before anything ran (a folder of
    another run, locked by another process), it frees the run's lease again."""
    plan, registry = context.plan, context.registry
    metadata = initial_metadata(plan.request, type(context.env).__name__)
    notes = context.env.notices()
    if notes:
        metadata["notes"] = notes
    if plan.run_id is not None:
        metadata["run_id"] = plan.run_id
        add_provenance(metadata, plan)
    folder_lock = RunFolderLock(plan.run_dir)
    try:
        if plan.resume_folder:
            metadata = check_resumable(plan.run_dir, plan.request, metadata)
        folder_lock.acquire()  # before anything in the folder is written
        # a killed holder's tracker may still be finishing a write here: its end first
        await asyncio.to_thread(wait_for_tracker, plan.run_dir)
    except (VfopsError, OSError):
        folder_lock.release()
        # refused before anything ran: the run is free again for a corrected command
        if registry is not None and plan.run_id is not None and plan.lease is not None:
            # best effort: an unreleased lease expires anyway; the refusal is the news
            with contextlib.suppress(Exception):
                await registry.release_lease(plan.run_id, plan.lease)
        raise
    try:
        return await _run_locked(context, metadata)
    finally:
        folder_lock.release()


class _Delivery:
    """Each scored group: to the folder, then to every sink, then counted and shown."""

    def __init__(
        self,
        context: RunContext,
        writer: RolloutWriter,
        own: DefaultSinks,
        summary: EvalSummary,
    ) -> None:
        self.context, self.writer, self.summary = context, writer, summary
        self.sinks: list[Sink] = list(own.sinks)
        self.tracking = own.tracking
        self.in_delivery: set[asyncio.Future[None]] = set()

    async def to_sinks(self, records: list[RolloutRecord]) -> None:
        for sink in self.sinks:
            await sink.write_group(records)
        for record in records:
            self.summary.add(record)
        if self.tracking is not None:
            await self.tracking.write_group(records)
        progress = self.context.progress
        if progress is not None:
            progress.group(records, self.summary)

    async def handle(self, records: list[RolloutRecord]) -> None:
        # first: what is on disk survives a crash; a group not wholly written (a full
        # disk) reaches no sink, so the registry never holds what the folder lacks
        to_folder(self.context.plan, self.writer.write_group, records)
        # A group on disk reaches every sink even when the run is interrupted
        # meanwhile (SIGINT/SIGTERM): the registry then holds what the folder holds.
        delivering = asyncio.ensure_future(self.to_sinks(records))
        self.in_delivery.add(delivering)
        delivering.add_done_callback(self.in_delivery.discard)
        await asyncio.wait({delivering})
        delivering.result()

    async def drain(self) -> None:
        """An interrupted group's delivery ends before the sinks close."""
        if self.in_delivery:
            delivering = set(self.in_delivery)
            await asyncio.wait(delivering)
            for late in delivering:  # a sink's failure is raised again by its close
                _ = late.cancelled() or late.exception()


async def _run_locked(context: RunContext, metadata: dict[str, Any]) -> EvalResult:
    plan = context.plan
    writer = RolloutWriter(plan.run_dir)
    summary = EvalSummary(pass_threshold=plan.request.pass_threshold)
    registry_source = context.opening or context.registry
    recording = Recording(
        plan, registry_source, context.tracker, writer, summary, context.mlflow_parent_run_id
    )
    own = open_sinks(recording, context.extra_sinks, context.plugin_sinks)
    delivery = _Delivery(context, writer, own, summary)
    done: set[tuple[int, int]] = set()
    status, error = "interrupted", None
    started = time.perf_counter()
    try:
        to_folder(plan, write_metadata, plan.run_dir, metadata)
        await _catch_up(plan, delivery.sinks, summary, done)
        if plan.done_in_registry - done:
            # on the registry only (written by another worker, or lost from this folder):
            # copied here, so that the folder holds the whole run again
            await _copy_from_registry(plan, writer, delivery.sinks, summary, done, registry_source)
        if context.progress is not None:
            opened = OpenedRun(plan.run_id, plan.run_dir, plan.action, context.planned, len(done))
            context.progress.opened(opened)
        # containers a rollout starts are labelled with the run (vfops.sandbox)
        with run_scope(plan.run_id or plan.run_dir.name), image_map_scope(plan.request.image_map):
            await run_rollouts(context.env, context.client, plan.request, done, delivery.handle)
        status = "completed"
    except SinkError as exc:
        status, error = "failed", str(exc)
    except BudgetExhausted as exc:
        status, error = "budget_exhausted", budget_hint(plan, exc, context.planned)
    except asyncio.CancelledError:
        status = "interrupted"
        raise
    except BaseException as exc:
        status, error = "failed", resume_hint(plan, first_line(exc))
        raise
    finally:
        summary.wall_s = time.perf_counter() - started
        writer.close()

        async def settle() -> EvalResult:
            await delivery.drain()
            if context.opening is None:
                registry = context.registry
            else:
                registry = await opened_registry(context.opening)
            add_provenance(metadata, plan)
            return await finish_run(
                plan,
                delivery.sinks,
                delivery.tracking,
                summary,
                metadata,
                status,
                error,
                registry=registry,
            )

        result = await settled(settle())
    return result


async def _catch_up(
    plan: Plan,
    sinks: Sequence[Sink],
    summary: EvalSummary,
    done: set[tuple[int, int]],
) -> None:
    """Resume: count the records on disk and send them on to the sinks.

    The Arrow export is rebuilt from all of them; the registry gets those it
    misses (a crash between the two writes), so nothing completed is regenerated.
    """
    if not plan.resume_folder:
        return
    batch: list[RolloutRecord] = []
    for record in iter_records(plan.run_dir):
        if record.key in done:
            continue
        done.add(record.key)
        summary.add(record, new=False)
        batch.append(record)
        if len(batch) >= _CATCH_UP_BATCH:
            await _send_caught_up(sinks, batch, plan.done_in_registry)
            batch = []
    await _send_caught_up(sinks, batch, plan.done_in_registry)


async def _send_caught_up(
    sinks: Sequence[Sink], records: list[RolloutRecord], in_registry: set[tuple[int, int]]
) -> None:
    if not records:
        return
    for sink in sinks:
        if isinstance(sink, RegistrySink):
            missing = [r for r in records if r.key not in in_registry]
            if missing:
                await sink.write_group(missing)
        else:
            await sink.write_group(records)


async def _copy_from_registry(
    plan: Plan,
    writer: RolloutWriter,
    sinks: Sequence[Sink],
    summary: EvalSummary,
    done: set[tuple[int, int]],
    registry: RunStore | asyncio.Future[RunStore] | None,
) -> None:
    """Resume: write the rollouts the registry holds and this folder lacks into the
    folder (and the export), so that nothing completed is regenerated and the folder
    holds the whole run."""
    assert registry is not None and plan.run_id is not None
    store = registry if not isinstance(registry, asyncio.Future) else await registry
    # one pass over the run's rows in the registry (each call would stream them all)
    found = await store.rollouts(plan.run_id, plan.done_in_registry - done)
    for start in range(0, len(found), _CATCH_UP_BATCH):
        records = found[start : start + _CATCH_UP_BATCH]
        to_folder(plan, writer.write_group, records)
        for sink in sinks:
            if not isinstance(sink, RegistrySink):
                await sink.write_group(records)
        for record in records:
            done.add(record.key)
            summary.add(record, new=False)


def to_folder(plan: Plan, write: Callable[..., None], *args: Any) -> None:
    """``write(*args)`` into the run folder; a folder that cannot take it (a full disk)
    fails the run as a sink does, with how to finish it elsewhere."""
    try:
        write(*args)
    except DiskWriteError as exc:
        label = plan.run_id or plan.run_dir
        raise SinkError(
            "run folder",
            str(exc),
            f"free space there and finish the run with vfops eval ... --resume {label} "
            f"(or move the folder {plan.run_dir} elsewhere and pass its new path to --resume)",
        ) from exc
