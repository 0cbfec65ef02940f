"""Starting what records an evaluation: the MLflow tracker and the registry service.

Both start once the environment is loaded and its rows are checked, never before: a
refused environment or argument starts neither (nor writes a store). The tracker
(MLflow, in a process of its own) then starts first, so its imports and the opening
of the tracking store overlap the model and the first rollouts; on the default
registry the registry's operations run in it (its side service), so one recorder
process, not two, holds SQLAlchemy. A tracking server that does not answer fails
here, before a run is recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from vfops.registry import RunStore
    from vfops.tracking import Tracker


async def run_store(engine: Engine | None, tracker: Tracker | None) -> RunStore:
    """The run store on the caller's engine in a worker thread, else on the default
    registry in the tracker process when it serves it (:func:`start_tracker` with
    ``serve_registry``), else in a child process of its own (see
    :mod:`vfops.registry._service`)."""
    from vfops.registry import ProcessService, RunStore, ThreadService

    if engine is not None:
        return RunStore(ThreadService(engine))
    channel = tracker.take_side_channel() if tracker is not None else None
    if channel is not None:
        return RunStore(await ProcessService.over(channel))
    return RunStore(await ProcessService.start())


def tracking_on(tracking: bool | None) -> bool:
    from vfops.tracking import tracking_enabled

    return tracking_enabled() if tracking is None else tracking and tracking_enabled()


def start_tracker(env_name: str, *, serve_registry: bool) -> Tracker:
    """The tracker of an evaluation of ``env_name``; ``serve_registry``: it also serves
    the evaluation's calls to the default registry
    (:data:`vfops.registry.SERVICE`)."""
    from vfops.registry import SERVICE
    from vfops.tracking import Tracker

    return Tracker.spawn(env_name=env_name, side_service=SERVICE if serve_registry else None)


def check_tracking_server() -> None:
    """A tracking server that does not answer, or an SQLite store whose folder cannot
    be written, fails now, before a run is recorded (MLflow itself is not imported:
    the tracker process does that)."""
    from vfops.tracking import check_sqlite_store, check_tracking, is_embedded, tracking_uri

    uri = tracking_uri()
    if not is_embedded() and uri.startswith(("http://", "https://")):
        check_tracking()
    else:
        check_sqlite_store(uri)
