"""The default sinks of a run, built in one place: :func:`default_sinks`.

Which sinks a run gets depends on what records it: with the registry, the
:class:`~vfops.evaluation._sinks.RegistrySink` (which also renews the run's lease);
with MLflow as well, the :class:`~vfops.evaluation._sinks.TrackingSink`, whose
tracker process also writes the Arrow export (it reads every rollout from
``results.jsonl`` anyway); otherwise the :class:`~vfops.evaluation._sinks.ArrowSink`
in this process. Sinks a caller passes (``evaluate_async(..., sinks=...)``) come
after these and get the same groups.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vfops.evaluation._sinks import (
    ArrowSink,
    RegistrySink,
    Sink,
    TrackerExportSink,
    TrackingSink,
)
from vfops.evaluation._store import ARROW_FILE

if TYPE_CHECKING:
    from vfops.evaluation._open_run import Plan
    from vfops.evaluation._store import RolloutWriter
    from vfops.registry import RunStore
    from vfops.stats import EvalSummary
    from vfops.tracking import Tracker


@dataclass
class DefaultSinks:
    """A run's own sinks: ``sinks`` take every group (in order) and are closed before the
    run's end is recorded; ``tracking`` (MLflow) is told of each group after them and
    closed after the registry has the run's end."""

    sinks: list[Sink]
    tracking: TrackingSink | None


def default_sinks(
    plan: Plan,
    registry: RunStore | asyncio.Future[RunStore] | None,
    tracker: Tracker | None,
    writer: RolloutWriter,
    summary: EvalSummary,
    mlflow_parent_run_id: str | None = None,
) -> DefaultSinks:
    """The sinks of ``plan``'s run, started (the registry's renews the run's lease from
    now on, however slow the rollouts; the MLflow run opens once the registry run has)."""
    sinks: list[Sink] = []
    tracking: TrackingSink | None = None
    if registry is not None and plan.run_id is not None:
        registry_sink = RegistrySink(registry, plan.run_id, lease=lambda: plan.lease)
        registry_sink.start()
        sinks.append(registry_sink)
        if tracker is not None:
            # recorded while it runs; closed after the registry has the run's end. The
            # tracker reads every rollout from results.jsonl, so it writes the Arrow
            # export too (rebuilt whole on --resume: it reads the file from its start)
            tracking = TrackingSink(
                tracker,
                registry,
                plan.run_id,
                results=lambda: writer.size,
                results_path=writer.path,
                summary=summary,
                parent_run_id=mlflow_parent_run_id,
                export=plan.run_dir / ARROW_FILE,
                lease=lambda: plan.lease,
            )
            tracking.start()
            sinks.append(TrackerExportSink(tracking))
    if tracking is None:
        sinks.insert(0, ArrowSink(plan.run_dir, resume=plan.run_id or plan.run_dir))
    return DefaultSinks(sinks, tracking)
