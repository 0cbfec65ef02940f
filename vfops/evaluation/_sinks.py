"""Where an evaluation's rollouts go: sinks, each fed every scored group.

The run folder (``results.jsonl`` + ``metadata.json``) is always the first sink:
it is flushed per group, so a killed process loses only groups in flight, and
``--resume`` rebuilds every other sink from it. The others (the registry, the
Arrow export, MLflow) overlap the rollouts: they buffer and write in the
background, so their cost does not follow the last rollout.

A sink that fails raises :class:`SinkError` naming itself and the fix; the
evaluation then stops, records the run as ``failed`` and says how to finish it
with ``--resume``. Nothing is swallowed: a run is never "completed" with rows
missing in one of its sinks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar, runtime_checkable

from vfops._arrow import ResultsExport, export_fix, export_problem
from vfops._errors import VfopsError
from vfops._plain_json import UnrecordableValueError
from vfops._rollout import RolloutRecord
from vfops.evaluation._store import ARROW_FILE

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from vfops._lease import LeaseOwner
    from vfops.registry import RunStore
    from vfops.stats import EvalSummary

T = TypeVar("T")


class SinkError(VfopsError):
    """A sink could not take the run's rollouts; the message names it and the fix."""

    def __init__(self, sink: str, problem: str, fix: str) -> None:
        super().__init__(f"{sink}: {problem}; {fix}")
        self.sink = sink


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


@dataclass
class RunFinish:
    """How a run ended, handed to every sink's ``close``."""

    status: str  # "completed" | "failed" | "interrupted"
    summary: EvalSummary
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Sink(Protocol):
    """One destination of a run's rollouts.

    Anything with a ``name`` (said in the run's error when the sink fails) and these
    two coroutines is a sink: pass it to ``evaluate_async(..., sinks=[...])`` and it
    gets every scored group, after the run folder and the run's own sinks
    (:func:`vfops.evaluation.default_sinks`), including the groups a resumed run
    already held; ``close`` is awaited once, however the run ended, before that end
    is recorded. A sink that raises stops the run (``failed``, resumable): raise
    :class:`SinkError` to name the fix.
    """

    name: str

    async def write_group(self, records: list[RolloutRecord]) -> None:
        """Take one scored group (may buffer; raises :class:`SinkError` on failure)."""

    async def close(self, finish: RunFinish) -> None:
        """Flush everything and record how the run ended (raises :class:`SinkError`)."""


class ArrowSink:
    """``rollouts.arrow`` in the run folder: an Arrow IPC stream, written in batches.

    ``datasets.Dataset.from_file`` memory-maps it (:func:`load_results`), so the
    export costs nothing after the last rollout. On ``--resume`` it is rewritten
    from ``results.jsonl`` (the evaluation feeds the records on disk first).

    Batches are written by a worker thread, one at a time and in order, so the
    event loop keeps sending requests meanwhile; pyarrow itself is imported by
    the first batch, not at start-up (:class:`vfops._arrow.ResultsExport`). A tracked
    ``vfops eval`` has its tracker write the file instead (:class:`TrackerExportSink`).
    """

    name = "export (rollouts.arrow)"

    def __init__(self, run_dir: Path, *, resume: object = None, batch_rows: int = 1024) -> None:
        self._export = ResultsExport(run_dir / ARROW_FILE, batch_rows=batch_rows)
        self._resume = resume if resume is not None else run_dir  # the run's id, for the fix
        self._writing: asyncio.Future[None] | None = None

    async def write_group(self, records: list[RolloutRecord]) -> None:
        if self._export.buffer(records):
            await self._flush()

    async def _flush(self) -> None:
        """Hand the buffered rows to the writer thread once the previous batch is written."""
        await self._wait_for_writer()
        rows = self._export.take()
        if rows:
            self._writing = asyncio.ensure_future(
                asyncio.to_thread(self._guarded, self._export.write, rows)
            )

    async def _wait_for_writer(self) -> None:
        writing = self._writing
        if writing is not None:
            await asyncio.wait({writing})  # a cancelled caller does not cancel the write
            self._writing = None
            writing.result()  # raises the SinkError of a batch that failed

    def _guarded(self, write: Callable[..., None], *args: Any) -> None:
        try:
            write(*args)
        except OSError as exc:
            problem = export_problem(self._export.path, exc)
            raise SinkError(self.name, problem, export_fix(self._resume)) from exc

    async def close(self, finish: RunFinish) -> None:
        try:
            await self._flush()
            await self._wait_for_writer()
        finally:
            if self._writing is not None:  # interrupted while a batch was being written
                await asyncio.wait({self._writing})
            # a run without rollouts still gets its (empty) stream, complete before it
            # takes the final name
            await asyncio.to_thread(self._guarded, self._export.seal)


class _RunNotOpened(VfopsError):
    """The registry run, opened in the background, could not be created."""


class _RegistryDown(VfopsError):
    """The registry's database did not answer for the whole retry window."""


class _LeaseLost(VfopsError):
    """Another process took the run over (this one could not renew its lease in time)."""


log = logging.getLogger("vfops.evaluation")


class RegistrySink:
    """Batches scored groups into the registry from a background writer.

    ``write_group`` only appends to a buffer; a full buffer is queued for the
    writer and a bounded queue applies backpressure if the database lags, so
    memory stays constant in the number of rollouts. A failed insert stops the
    run at the next group (it is never swallowed); ``--resume`` sends the rows
    on disk that the registry misses.

    When the database stops answering (connection errors), every write is retried
    with backoff for up to ``retry_s`` (``VFOPS_REGISTRY_RETRY_S``), and meanwhile
    ``write_group`` waits: no more rollouts are generated than are in flight, so
    an outage does not burn the endpoint. If the database comes back the run goes
    on; if not, the run fails and ``--resume`` finishes it. The writer also renews
    the run's lease (``lease``: this evaluation's, once the run is open).
    """

    name = "registry"

    def __init__(
        self,
        registry: RunStore | asyncio.Future[RunStore],
        run_id: str,
        *,
        batch_rows: int = 512,
        flush_interval_s: float = 1.0,
        max_pending_batches: int = 4,
        lease: Callable[[], LeaseOwner | None] | None = None,
        retry_s: float | None = None,
    ) -> None:
        from vfops._settings import registry_retry_s

        # a future: the run is being opened meanwhile; rows wait in the buffer for it
        self._registry = registry
        self._run_id = run_id
        self._batch_rows = batch_rows
        self._flush_interval_s = flush_interval_s
        self._buffer: list[RolloutRecord] = []
        self._queue: asyncio.Queue[list[RolloutRecord] | None] = asyncio.Queue(max_pending_batches)
        self._writer: asyncio.Task[None] | None = None
        self._lease = lease
        self._retry_s = registry_retry_s() if retry_s is None else retry_s
        self._answering = asyncio.Event()  # cleared while the database does not answer
        self._answering.set()
        self.inserted = 0

    def start(self) -> None:
        """Start the writer now (it renews the lease even before the first group)."""
        self._start()

    async def write_group(self, records: list[RolloutRecord]) -> None:
        writer = self._start()
        if writer.done():
            self._raise_failure(writer)
        if not self._answering.is_set():
            # the database is down: wait for it (or for the writer to give up)
            answering = asyncio.ensure_future(self._answering.wait())
            await asyncio.wait({answering, writer}, return_when=asyncio.FIRST_COMPLETED)
            answering.cancel()
            if writer.done():
                self._raise_failure(writer)
        self._buffer.extend(records)
        if len(self._buffer) >= self._batch_rows:
            await self._put(self._take())

    def _start(self) -> asyncio.Task[None]:
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_loop())
        return self._writer

    async def _put(self, item: list[RolloutRecord] | None) -> None:
        """Queue ``item``, but stop waiting (and raise) if the writer died meanwhile."""
        writer = self._start()
        put = asyncio.ensure_future(self._queue.put(item))
        await asyncio.wait({put, writer}, return_when=asyncio.FIRST_COMPLETED)
        if not put.done():
            put.cancel()
            self._raise_failure(writer)

    def _raise_failure(self, writer: asyncio.Task[None]) -> None:
        exc = writer.exception() if not writer.cancelled() else None
        resume = f"vfops eval ... --resume {self._run_id}"
        if isinstance(exc, UnrecordableValueError):  # the value's fault, not the database's
            raise SinkError(
                self.name,
                f"could not record run {self._run_id}: {exc.problem}",
                f"{exc.fix}, then run the evaluation again",
            ) from exc
        if isinstance(exc, _RunNotOpened):
            raise SinkError(
                self.name,
                f"could not record run {self._run_id} ({exc})",
                "fix the database (VFOPS_DATABASE_URL), then run the evaluation again "
                "(the rollouts so far are in its folder)",
            ) from exc
        if isinstance(exc, _RegistryDown):
            raise SinkError(
                self.name,
                f"the database did not answer for {self._retry_s:g} s ({exc})",
                "bring it back (VFOPS_DATABASE_URL; wait longer with VFOPS_REGISTRY_RETRY_S), "
                f"then finish the run with {resume}",
            ) from exc
        if isinstance(exc, _LeaseLost):
            raise SinkError(
                self.name,
                f"another process took run {self._run_id} over ({exc})",
                "let that process finish it (never work on one run twice at once)",
            ) from exc
        problem = first_line(exc) if exc is not None else "the writer stopped"
        raise SinkError(
            self.name,
            f"could not store rollouts of run {self._run_id} ({problem})",
            f"fix the database (VFOPS_DATABASE_URL), then finish the run with {resume}",
        ) from exc

    def _take(self) -> list[RolloutRecord]:
        batch, self._buffer = self._buffer, []
        return batch

    async def _opened_registry(self) -> RunStore:
        if not isinstance(self._registry, asyncio.Future):
            return self._registry
        try:
            return await self._registry
        except UnrecordableValueError:
            raise
        except Exception as exc:
            raise _RunNotOpened(first_line(exc)) from exc

    async def _write_loop(self) -> None:
        registry = await self._opened_registry()
        from vfops._lease import LEASE_TTL_S

        renew_every = LEASE_TTL_S / 4
        next_renewal = time.monotonic() + renew_every
        while True:
            wait_s = max(0.0, min(self._flush_interval_s, next_renewal - time.monotonic()))
            try:
                batch = await asyncio.wait_for(self._queue.get(), wait_s)
            except TimeoutError:
                batch = self._take()  # a slow run still reaches the registry every second
            if batch is None:
                return
            if batch:
                lease = self._lease() if self._lease is not None else None
                self.inserted += await self.retrying(
                    partial(registry.insert, self._run_id, batch, lease)
                )
            if time.monotonic() >= next_renewal:
                await self._renew(registry)
                next_renewal = time.monotonic() + renew_every

    async def _renew(self, registry: RunStore) -> None:
        lease = self._lease() if self._lease is not None else None
        if lease is not None and not await self.retrying(
            partial(registry.renew_lease, self._run_id, lease)
        ):
            raise _LeaseLost("its lease lapsed while the registry did not answer")

    async def retrying(self, write: Callable[[], Awaitable[T]]) -> T:
        """``await write()`` (a registry write); tried again with backoff while the
        database does not answer (connection errors only: a refused row is not
        retried), for ``retry_s``."""
        from vfops.registry import RegistryUnavailable

        down_since: float | None = None
        delay = 0.25
        while True:
            try:
                result = await write()
            except RegistryUnavailable as exc:
                now = time.monotonic()
                if down_since is None:
                    down_since = now
                    self._answering.clear()
                    log.warning(
                        "registry: the database does not answer (%s); rollouts paused, "
                        "retrying for up to %g s (VFOPS_REGISTRY_RETRY_S)",
                        f"{exc.url}: {exc.reason}",
                        self._retry_s,
                    )
                left = self._retry_s - (now - down_since)
                if left <= 0:
                    raise _RegistryDown(f"{exc.url}: {exc.reason}") from exc
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, _MAX_RETRY_DELAY_S)
                continue
            if down_since is not None:
                self._answering.set()
                log.warning("registry: the database answers again; rollouts resumed")
            return result

    @property
    def gave_up(self) -> bool:
        """The writer stopped because the database did not answer (no use retrying now)."""
        writer = self._writer
        return (
            writer is not None
            and writer.done()
            and not writer.cancelled()
            and isinstance(writer.exception(), _RegistryDown)
        )

    async def close(self, finish: RunFinish) -> None:
        """Flush everything buffered and stop the writer (raises if a write failed)."""
        writer = self._start()
        await self._put(self._take())
        await self._put(None)
        await asyncio.wait({writer})
        if writer.cancelled() or writer.exception() is not None:
            self._raise_failure(writer)


_MAX_RETRY_DELAY_S: Final = 5.0
"""The longest pause between two tries of an unanswered registry write."""


class TrackingSink:
    """The run in MLflow, recorded while it runs by a tracker process (:mod:`vfops.tracking`).

    The tracker is started before anything else of the evaluation, so its imports and
    the opening of the tracking store overlap the environment, the model and the
    rollouts. The MLflow run is opened as soon as the registry run is; every
    ``progress_every_s`` the tracker is told how far ``results.jsonl`` has grown (it
    reads the new rollouts there, logs the sampled ones as traces and the statistics so
    far as metrics); ``close`` asks it to record the end (the rest of the rollouts, the
    rollouts file as an artifact, the final metrics and status) and waits until it
    has, then links the registry run to the MLflow run. A tracker that reports an error
    stops the run at the next group.
    """

    name = "MLflow"

    def __init__(
        self,
        tracker: Any,
        registry: RunStore | asyncio.Future[RunStore],
        run_id: str,
        *,
        results: Callable[[], int],
        results_path: Path,
        summary: EvalSummary,
        parent_run_id: str | None = None,
        progress_every_s: float = 1.0,
        export: Path | None = None,
        lease: Callable[[], LeaseOwner | None] | None = None,
    ) -> None:
        self._tracker = tracker
        self._lease = lease
        self._registry = registry
        self._run_id = run_id
        self._results = results
        self._results_path = results_path
        self._summary = summary
        self._parent_run_id = parent_run_id
        self._progress_every_s = progress_every_s
        self._export = export
        self._info: dict[str, Any] | None = None
        self._opening: asyncio.Task[dict[str, Any] | None] | None = None
        self._next_progress = time.monotonic() + progress_every_s
        self.mlflow_run_id: str | None = None

    def start(self) -> None:
        """Open the MLflow run once the registry run exists (in the background)."""
        if self._opening is None:
            self._opening = asyncio.create_task(self._open())

    async def _open(self) -> dict[str, Any] | None:
        registry = await _registry_of(self._registry)
        if registry is None:
            return None  # the registry sink reports why
        from vfops.tracking import run_info_json

        info = run_info_json(await registry.record(self._run_id))
        lease = self._lease() if self._lease is not None else None
        self._tracker.open(
            info,
            results=self._results_path,
            pass_threshold=self._summary.pass_threshold,
            parent_run_id=self._parent_run_id,
            export=self._export,
            # the MLflow run's end is written only while it names this evaluation
            holder=None if lease is None else str(lease),
        )
        self._info = info
        return info

    def _fail(self, problem: str) -> SinkError:
        return SinkError(
            self.name,
            f"could not log run {self._run_id} ({problem})",
            "fix MLFLOW_TRACKING_URI (or pass --no-tracking), then finish the run with "
            f"vfops eval ... --resume {self._run_id}",
        )

    async def write_group(self, records: list[RolloutRecord]) -> None:
        failure = self._tracker.failed_now()
        if failure is not None:
            raise self._fail(failure)
        now = time.monotonic()
        if self._info is not None and now >= self._next_progress:
            self._next_progress = now + self._progress_every_s
            summary = self._summary
            self._tracker.progress(self._results(), summary.progress_dict(), summary.rollouts)

    async def _opened(self) -> dict[str, Any] | None:
        """The run's info once the MLflow run is asked to open (None: its registry run
        never was); raises the sink's error when the registry run was not readable."""
        self.start()
        assert self._opening is not None
        await asyncio.wait({self._opening})
        if self._opening.cancelled():
            raise self._fail("it was not opened")
        if self._opening.exception() is not None:
            raise self._fail("its registry run was not readable")
        return self._info

    def abandon(self) -> None:
        """Stop the tracker without ending or changing the MLflow run: this process lost
        the run to another (:class:`vfops._lease.LeaseLostError`), whose tracker ends it."""
        self._tracker.kill()

    async def seal_export(self) -> None:
        """Wait until the tracker has written the whole ``rollouts.arrow`` (``export``)."""
        assert self._export is not None
        if await self._opened() is None:  # the registry sink says why the run was never opened
            problem = "not written (the run was never opened)"
            raise SinkError(ArrowSink.name, problem, export_fix(self._run_id))
        from vfops.tracking import ExportError

        try:
            await self._tracker.seal(self._results())
        except ExportError as exc:
            raise SinkError(ArrowSink.name, str(exc), export_fix(self._run_id)) from exc
        except VfopsError as exc:
            raise self._fail(str(exc)) from exc

    async def close(self, finish: RunFinish) -> None:
        """Record the end in MLflow (``finish.extra["rollouts_file"]``: the whole run's
        rollouts, for a completed run), wait for it, and link the registry run."""
        opened = await self._opened()
        if opened is None:
            return  # the registry run was never opened: nothing to log it against
        from vfops.evaluation._runner import now_iso

        info = {
            **opened,
            "status": finish.status,
            "summary": finish.summary.to_dict(),
            "finished_at": now_iso(),
        }
        from vfops.tracking import RunTakenOver

        try:
            self.mlflow_run_id = await self._tracker.finish(
                info,
                size=self._results(),
                rollouts_file=finish.extra.get("rollouts_file"),
                step=int(finish.summary.rollouts),
            )
        except RunTakenOver as exc:  # not MLflow's fault: nothing to fix there
            raise SinkError(
                self.name, str(exc).split(";")[0], "let that process finish it"
            ) from exc
        except VfopsError as exc:
            raise self._fail(str(exc)) from exc
        registry = await _registry_of(self._registry)
        assert registry is not None
        await registry.link_mlflow(self._run_id, self.mlflow_run_id)


class TrackerExportSink:
    """``rollouts.arrow`` written by the tracker (:class:`TrackingSink`'s ``export``),
    from the ``results.jsonl`` it reads anyway: the evaluating process never imports
    pyarrow (and numpy), its memory and its core stay the rollouts'. Closing waits until
    the file is complete, before the run's end is recorded anywhere."""

    name = ArrowSink.name

    def __init__(self, tracking: TrackingSink) -> None:
        self._tracking = tracking

    async def write_group(self, records: list[RolloutRecord]) -> None:
        return None  # the tracker reads them from results.jsonl (told by the TrackingSink)

    async def close(self, finish: RunFinish) -> None:
        await self._tracking.seal_export()


async def _registry_of(
    registry: RunStore | asyncio.Future[RunStore],
) -> RunStore | None:
    if not isinstance(registry, asyncio.Future):
        return registry
    await asyncio.wait({registry})
    if registry.cancelled() or registry.exception() is not None:
        return None
    return registry.result()
