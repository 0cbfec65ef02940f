"""A run's sinks, every one found by name in the ``vfops.eval_sinks`` entry points:
:func:`open_sinks`.

The built-in sinks are entry points of vfops itself, found and built exactly as a
plug-in's (``vfops plugins`` lists them): ``arrow`` (the Arrow export, written in this
process), ``registry`` (the run's rows; it also renews the run's lease) and ``mlflow``
(the run in MLflow, recorded by the tracker process, which also writes the Arrow
export: it reads every rollout from ``results.jsonl`` anyway, so ``arrow`` then makes
nothing). Every run gets :data:`BUILT_IN_SINKS`, each making its sink only when the run
records there (no registry, no tracker: none), then the caller's sink objects, then the
plug-ins it names (``vfops eval --sink NAME``).

A sink factory is called with the run's :class:`~vfops.evaluation.RunInfo`. One marked
:func:`opens_at_start` (the built-ins) is called before the first rollout, with what is
known then (a new run's version may still be on its way from the registry); any other
at the run's first group, with the whole info (the run recorded). The built-ins reach
the run's recorders through ``info.recording`` (:class:`Recording`); a plug-in needs
none of it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, TypeVar

from vfops._errors import InvalidArgumentError
from vfops.evaluation._plugins import BUILT_IN_SINKS, SINK_GROUP, PluginSink, RunInfo
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

F = TypeVar("F", bound=Callable[..., Any])


def opens_at_start(factory: F) -> F:
    """Mark a sink factory to be called before the run's first rollout (a sink that
    must work while the first group runs: renewing a lease, opening a tracking run)."""
    factory.opens_at_start = True  # type: ignore[attr-defined]
    return factory


@dataclass
class Recording:
    """Where a run is recorded, for the built-in sinks (``RunInfo.recording``)."""

    plan: Plan
    registry: RunStore | asyncio.Future[RunStore] | None
    """The registry's run store (a future while a new run is being recorded)."""
    tracker: Tracker | None
    writer: RolloutWriter
    summary: EvalSummary
    mlflow_parent_run_id: str | None = None
    tracking: TrackingSink | None = None
    """The MLflow sink, once ``mlflow`` made it (closed after the registry has the end)."""

    @property
    def tracked(self) -> bool:
        """The run is recorded in the registry and in MLflow."""
        return self.registry is not None and self.plan.run_id is not None and bool(self.tracker)


@opens_at_start
def arrow_sink(info: RunInfo) -> Sink | None:
    """``rollouts.arrow``, written here (a tracked run's tracker writes it instead)."""
    recording = info.recording
    if recording is None or recording.tracked:
        return None
    plan = recording.plan
    return ArrowSink(plan.run_dir, resume=plan.run_id or plan.run_dir)


@opens_at_start
def registry_sink(info: RunInfo) -> Sink | None:
    """The run's rows in the registry, batched; renews the run's lease from now on,
    however slow the rollouts."""
    recording = info.recording
    if recording is None or recording.registry is None or recording.plan.run_id is None:
        return None
    plan = recording.plan
    sink = RegistrySink(recording.registry, plan.run_id, lease=lambda: plan.lease)
    sink.start()
    return sink


@opens_at_start
def mlflow_sink(info: RunInfo) -> Sink | None:
    """The run in MLflow while it runs (opened once the registry run is), and the Arrow
    export written by the tracker (rebuilt whole on ``--resume``: it reads the file from
    its start)."""
    recording = info.recording
    if recording is None or not recording.tracked:
        return None
    plan, writer = recording.plan, recording.writer
    assert recording.registry is not None and plan.run_id is not None
    tracking = TrackingSink(
        recording.tracker,
        recording.registry,
        plan.run_id,
        results=lambda: writer.size,
        results_path=writer.path,
        summary=recording.summary,
        parent_run_id=recording.mlflow_parent_run_id,
        export=plan.run_dir / ARROW_FILE,
        lease=lambda: plan.lease,
    )
    tracking.start()
    recording.tracking = tracking
    return TrackerExportSink(tracking)


@dataclass
class DefaultSinks:
    """A run's sinks: ``sinks`` take every group (in order) and are closed before the
    run's end is recorded; ``tracking`` (MLflow) is told of each group after them and
    closed after the registry has the run's end."""

    sinks: list[Sink]
    tracking: TrackingSink | None


def sink_factories() -> dict[str, _Lazy]:
    """Every installed sink factory by name (vfops's own included)."""
    found: dict[str, Any] = {}
    for entry in entry_points(group=SINK_GROUP):
        found.setdefault(entry.name, entry)
    return {name: _Lazy(entry) for name, entry in found.items()}


class _Lazy:
    """An entry point's factory, imported when first called or asked about."""

    def __init__(self, entry: Any) -> None:
        self.entry = entry
        self._loaded: Callable[[RunInfo], Sink | None] | None = None

    def load(self) -> Callable[[RunInfo], Sink | None]:
        if self._loaded is None:
            self._loaded = self.entry.load()
        return self._loaded

    def __call__(self, info: RunInfo) -> Sink | None:
        return self.load()(info)


def open_sinks(
    recording: Recording, caller_sinks: Sequence[Sink] = (), plugins: Sequence[str] = ()
) -> DefaultSinks:
    """The run's sinks: :data:`BUILT_IN_SINKS`, ``caller_sinks``, then the named
    ``plugins``, each built by its entry point's factory (see the module's docstring)."""
    factories = sink_factories()
    missing = [name for name in (*BUILT_IN_SINKS, *plugins) if name not in factories]
    if missing:  # an install without vfops's own entry points (not reinstalled)
        raise InvalidArgumentError(
            f"no sink named {missing[0]!r} is installed; reinstall vfops "
            "(pip install -e . refreshes its entry points)"
        )
    at_start = start_info(recording)
    later = whole_info(recording)
    sinks: list[Sink] = []
    for name in BUILT_IN_SINKS:
        sinks.extend(_made(factories[name], name, at_start, later))
    sinks.extend(caller_sinks)
    for name in plugins:
        sinks.extend(_made(factories[name], name, at_start, later))
    return DefaultSinks(sinks, recording.tracking)


def _made(
    factory: _Lazy, name: str, at_start: RunInfo, later: Callable[[], Awaitable[RunInfo]]
) -> list[Sink]:
    if getattr(factory.load(), "opens_at_start", False):
        made = factory(at_start)
        return [] if made is None else [made]
    return [PluginSink(name, factory, later)]


def start_info(recording: Recording) -> RunInfo:
    """What is known of the run before its first rollout (a new run's version and code
    hash may still be on their way from the registry: None then)."""
    plan = recording.plan
    request, provenance = plan.request, plan.provenance
    return RunInfo(
        run_id=plan.run_id,
        run_dir=plan.run_dir,
        env_name=request.env_name,
        env_version=None if provenance is None else provenance.version,
        env_code_hash=None if provenance is None else provenance.code_hash,
        model=request.model,
        sampling_args=dict(request.sampling_args),
        env_args=dict(request.env_args),
        recording=recording,
    )


def whole_info(recording: Recording) -> Callable[[], Awaitable[RunInfo]]:
    """The run's whole :class:`RunInfo`, once it is known (recorded, when it is new)."""

    async def info() -> RunInfo:
        if isinstance(recording.registry, asyncio.Future):
            await asyncio.wait({recording.registry})  # its failure is the registry sink's
        known = start_info(recording)  # the provenance is in the plan now, if recorded
        if known.env_version is not None:
            return known
        # a run recorded in its folder only: the installed code's hash
        from vfops.publishing import inspect_installed

        installed = await asyncio.to_thread(inspect_installed, known.env_name)
        return dataclasses.replace(
            known, env_version=installed.local_label, env_code_hash=installed.code_hash
        )

    return info
