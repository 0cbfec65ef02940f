"""The tracker process (``python -m vfops.tracking._tracker_main ENV``); see
:mod:`vfops.tracking._tracker` for the protocol. Not imported by the package, so
running it as ``__main__`` does not import it twice."""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from vfops._on_demand import cache_entry_points, on_demand

# Before MLflow is imported: traces are exported by the thread that logs them. MLflow's
# own export queue polls, so a trace waited ~0.1 s for it (bench/trace_overhead.py);
# here nothing else waits on this process but the end of the run.
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")
# MLflow imports pandas for its dataset API at start-up; nothing this process does needs
# it (MLflow's skinny client runs without pandas), and it is ~50 MB of the tracker's
# memory and ~0.2 s of its start. A use of it here would fail loudly (ImportError).
sys.modules.setdefault("pandas", None)  # type: ignore[arg-type]
# Alembic's templates (Mako) highlight their tracebacks with pygments when it is
# there (~5 MB); without it Mako falls back to plain text, and this process never
# renders a template.
sys.modules.setdefault("pygments", None)  # type: ignore[arg-type]
# numpy likewise: MLflow imports it only where it is installed (its skinny client runs
# without it), pyarrow only to convert its own arrays to numpy's, and nothing this
# process records is a numpy value (the rollouts arrive as JSON): ~13 MB of its memory.
sys.modules.setdefault("numpy", None)  # type: ignore[arg-type]
# MLflow's gateway takes one exception class from fastapi, whose __init__ imports its
# application and routing (~9 % of this process's start-up CPU); the class comes from
# fastapi.exceptions, the rest of fastapi when anything asks for it.
on_demand("fastapi", served={"HTTPException": "exceptions"})
# MLflow's plugin registries (stores, artifact repositories, dataset sources, request
# headers...) each ask importlib.metadata for their entry-point group at start-up, and
# each ask reads every installed distribution's metadata (~10 % of the start-up's CPU
# here). Nothing is installed while one run is recorded: read once, selected per ask.
cache_entry_points()
# The Arrow export's batches come and go (one slice of rows at a time): the system
# allocator hands their memory back, where pyarrow's default pool keeps it reserved.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

import orjson  # noqa: E402  (after the settings above)

from vfops.tracking._lifeline import Lifeline, RunTakenOver, hold_run_folder  # noqa: E402

if TYPE_CHECKING:
    from vfops._rollout import RolloutRecord
    from vfops.tracking._eval_runs import OpenedRun
    from vfops.tracking._trace_batch import TraceWriter
    from vfops.tracking._traces import TraceSampler

# The protocol gets the original stdout to itself; anything a library prints
# (MLflow announces runs on stdout) goes to stderr instead.
_protocol = os.fdopen(os.dup(1), "wb", buffering=0)
os.dup2(2, 1)

_SLICE_BYTES: Final = 1 << 18
"""Of results.jsonl read and converted at once (~300 rows of a single-turn run, a
quarter of an export batch): the parsed rows and records of one slice are the
tracker's transient peak."""

_NICENESS: Final = 5
"""The tracker yields the CPU to the evaluation it records (on a small machine they
share the cores): its work only has to be done by the end of the run."""


def _answer(data: dict[str, Any]) -> None:
    # a broken pipe: the evaluation stopped listening (it is gone)
    with contextlib.suppress(BrokenPipeError):
        _protocol.write(orjson.dumps(data) + b"\n")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _side_service(spec: str, input_fd: int, output_fd: int) -> threading.Thread:
    """Run ``spec`` (``module:function``) as ``function(input, output)`` in a thread of
    its own (see :meth:`vfops.tracking.Tracker.spawn`); its output closes when it
    returns, which is how its caller sees it end."""

    def run() -> None:
        try:
            with os.fdopen(input_fd, "rb") as source, os.fdopen(output_fd, "wb") as sink:
                module, _, name = spec.partition(":")
                getattr(importlib.import_module(module), name)(source, sink)
        except Exception as exc:  # its caller sees the pipe close, and says so
            print(f"vfops: the tracker's {spec} ended: {_one_line(exc)}", file=sys.stderr)

    thread = threading.Thread(target=run, name="vfops-side-service", daemon=True)
    thread.start()
    return thread


def main(argv: list[str]) -> int:
    """Child side: open the store, then record one run until ``finish`` (or end of input).

    ``argv``: the environment's name, then optionally ``--side-service SPEC IN OUT``
    (served until its input closes: this returns only after it did). Returns the
    exit code: 1 when the run could not be recorded.
    """
    # Ctrl-C (and a SIGTERM sent to the whole group) reach this process too: the
    # evaluation decides when to stop, and still records the run's end through it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Start-up is imports (MLflow, SQLAlchemy: ~1.1 s of CPU), which the evaluation
    # waits for at its end: the cyclic GC would walk the objects they create again and
    # again (paused: ~0.15 s less). On again once the store answers (_track).
    gc.disable()
    side: threading.Thread | None = None
    lifeline: Lifeline | None = None
    if "--parent" in argv:
        at = argv.index("--parent")
        # first: the evaluation may die while this process starts
        lifeline = Lifeline(int(argv[at + 1]))
        argv = argv[:at] + argv[at + 2 :]
    if "--side-service" in argv:
        at = argv.index("--side-service")
        spec, input_fd, output_fd = argv[at + 1 : at + 4]
        argv = argv[:at] + argv[at + 4 :]
        # before the nice below, which is the calling thread's own on Linux: the side
        # service (the evaluation's registry calls) keeps the normal priority
        side = _side_service(spec, int(input_fd), int(output_fd))
    try:
        return _track(argv, lifeline)
    finally:
        if side is not None:
            side.join()


def _track(argv: list[str], lifeline: Lifeline | None = None) -> int:
    from vfops.tracking import check_tracking, prepare_experiment

    try:
        check_tracking()
        if argv:
            prepare_experiment(argv[0])  # created now, while the rollouts run
    except Exception as exc:
        _answer({"error": _one_line(exc)})
        return 1
    gc.enable()
    _answer({"ready": True})
    # Only now: the start-up is what a short evaluation waits for at its end, and at
    # nice 5 a busy machine's other processes starved it (a 15-rollout eval took 2.8 s
    # with one core busy, 6.7 s on a busy machine); the rollouts it reads from here on
    # can wait for the evaluation's CPU.
    with contextlib.suppress(OSError):
        os.nice(_NICENESS)
    run: _RunLog | None = None
    failure: str | None = None
    for line in sys.stdin.buffer:
        if lifeline is not None and lifeline.gone():
            # the evaluation died: what it queued is no holder's work any more, and the
            # run's next holder waits for this process to exit (its .tracker.lock)
            break
        command = orjson.loads(line)
        op = command.get("op")
        if failure is not None and op not in ("seal", "finish"):
            continue  # reported already; the seal and the finish answer it again
        try:
            if op == "open":
                run = _RunLog(command, lifeline)
                _answer({"opened": run.opened.mlflow_run_id})
            elif op == "progress" and run is not None:
                run.progress(command)
            elif op == "seal":
                if failure is not None:
                    raise RuntimeError(failure)
                if run is None:
                    raise RuntimeError("the run was never opened in MLflow")
                problem = run.seal(int(command["size"]))
                # the export's own failure (a full disk) is the run's, not MLflow's: the
                # MLflow run is still recorded (failed) by the finish that follows
                _answer({"sealed": True} if problem is None else {"export_error": problem})
            elif op == "finish":
                if failure is not None:
                    raise RuntimeError(failure)
                if run is None:
                    raise RuntimeError("the run was never opened in MLflow")
                run.finish(command)
                _answer({"ok": True, "mlflow_run_id": run.opened.mlflow_run_id})
                return 0
        except RunTakenOver as exc:
            # another process holds the run now: nothing more is written, and the
            # evaluation is told who (it exits as a holder that lost its run)
            failure = failure or _one_line(exc)
            _answer({"ok": False, "error": failure, "taken_over": exc.holder})
            if op == "finish":
                return 1
        except _ParentGone:
            break
        except Exception as exc:
            failure = failure or _one_line(exc)
            _answer({"ok": False, "error": failure})
            if op == "finish":
                return 1
    # End of input without a finish: the evaluation died (killed) before recording its
    # end. Its MLflow run is labelled so (never left "running", unless another process
    # holds it now); --resume finishes it.
    if run is not None:
        run.abandon(mark_killed=failure is None)
    return 0


class _RunLog:
    """One eval run's MLflow run, recorded while the evaluation runs.

    ``open`` creates (or finds again) the run and logs its params; each ``progress``
    reads the rollouts the evaluation appended to its ``results.jsonl`` since the last
    one (``size``: its length now, always at a line's end), appends them to the run's
    ``rollouts.arrow`` (``export``: the evaluating process then never imports pyarrow),
    logs the sampled ones as traces and the statistics so far as metrics; ``seal``
    reads the rest and completes ``rollouts.arrow``; ``finish`` logs the rollouts file
    as an artifact and the final metrics, and ends the run.
    """

    def __init__(self, command: dict[str, Any], lifeline: Lifeline | None = None) -> None:
        from vfops._arrow import ResultsExport
        from vfops._settings import trace_rollouts
        from vfops.tracking import tracking_uri
        from vfops.tracking._eval_runs import RUN_ID_TAG, open_mlflow_run
        from vfops.tracking._trace_batch import TraceWriter
        from vfops.tracking._traces import TraceSampler

        info: dict[str, Any] = command["info"]
        results = command.get("results")
        self._results = Path(results) if results else None
        self._lifeline = lifeline
        if self._results is not None:
            # held until this process exits: the run's next holder waits for it
            hold_run_folder(self._results.parent)
        if lifeline is not None and lifeline.gone():
            raise _ParentGone  # died while this was waiting: its run is not this one's now
        self._holder: str | None = command.get("holder")
        self.opened: OpenedRun = open_mlflow_run(
            info, parent_run_id=command.get("parent_run_id"), holder=self._holder
        )
        self._offset = 0
        export = command.get("export")
        self._export = ResultsExport(Path(export)) if export and self._results else None
        self._export_error: str | None = None
        self._held: list[dict[str, Any]] = []  # sampled by the seal, traced by a completed finish
        self._pass_threshold = float(command.get("pass_threshold", 1.0))
        limit = trace_rollouts()
        self._sampler: TraceSampler | None = None
        self._writer: TraceWriter | None = None
        if limit is not None and self._results is not None:
            self._sampler = TraceSampler(
                limit=limit, failed_limit=limit,
                pass_threshold=self._pass_threshold,
            )  # fmt: skip
            self._writer = TraceWriter(
                tracking_uri=tracking_uri(),
                experiment_id=self.opened.experiment_id,
                mlflow_run_id=self.opened.mlflow_run_id,
                # the rest is the run's (few tags: the UI lists them all)
                tags={RUN_ID_TAG: str(info["id"])},
                pass_threshold=self._pass_threshold,
                skip_logged=self.opened.logged_before,
            )

    def progress(self, command: dict[str, Any]) -> None:
        from vfops.tracking._eval_runs import log_progress

        self._read_to(int(command["size"]))
        summary = command.get("summary")
        if summary:
            log_progress(self.opened.mlflow_run_id, summary, int(command.get("step", 0)))

    def finish(self, command: dict[str, Any]) -> None:
        from vfops.tracking._eval_runs import check_holder, finish_mlflow_run

        info: dict[str, Any] = command["info"]
        check_holder(self.opened.mlflow_run_id, self._holder)  # before anything is written
        held, self._held = self._held, []
        if info.get("status") == "completed":
            # every rollout is traced or not by now; an unfinished run only keeps what
            # was traced while it ran (it stopped: its user is waiting for the prompt)
            self._log([_record(row) for row in held])
            self._read_to(int(command["size"]))
            if self._sampler is not None:
                self._log([_record(row) for row in self._sampler.rest()])
        finish_mlflow_run(
            self.opened,
            info,
            rollouts_file=command.get("rollouts_file"),
            step=int(command.get("step", 0)),
            holder=self._holder,
        )

    def seal(self, size: int) -> str | None:
        """Read the rollouts up to ``size`` and complete ``rollouts.arrow``; returns the
        export's error (the run folder could not take it), None when it is written."""
        self._read_to(size, trace=False)
        if self._export is not None and self._export_error is None:
            try:
                self._export.seal()
            except OSError as exc:
                self._export_failed(exc)
        return self._export_error

    def _export_failed(self, exc: OSError) -> None:
        from vfops._arrow import export_problem

        assert self._export is not None
        self._export_error = export_problem(self._export.path, exc)
        self._export = None  # nothing more is written; the run fails at its seal

    def abandon(self, *, mark_killed: bool) -> None:
        """The evaluation died before the run's end: its unfinished export goes, and its
        MLflow run is ended ``KILLED`` if it still holds it (``mark_killed``)."""
        from vfops.tracking._eval_runs import end_killed

        if self._export is not None:
            self._export.discard()
        if mark_killed:
            with contextlib.suppress(Exception):  # best effort: --resume reopens it anyway
                end_killed(self.opened.mlflow_run_id, self._holder)

    def _read_to(self, size: int, *, trace: bool = True) -> None:
        """Take the rollouts appended up to ``size``: into the export, and offered to the
        trace sampler (``trace=False``: held for the finish, which knows whether the run
        completed)."""
        if self._results is None or size <= self._offset:
            return
        if self._sampler is None and self._export is None:
            return
        from vfops.tracking._results_tail import line_slices

        with self._results.open("rb") as handle:
            # a slice at a time: a tracker that fell behind (a busy machine) holds one
            # slice's rows, not all it has to catch up on
            for piece in line_slices(handle, self._offset, size, _SLICE_BYTES):
                if self._lifeline is not None and self._lifeline.gone():
                    raise _ParentGone  # a backlog of a dead evaluation is nobody's now
                self._offset += len(piece)
                self._take([orjson.loads(line) for line in _lines(piece)], trace=trace)

    def _take(self, rows: list[dict[str, Any]], *, trace: bool) -> None:
        if self._export is not None:
            try:
                self._export.add([_record(row) for row in rows])
            except OSError as exc:
                self._export_failed(exc)
        if self._sampler is None:
            return
        chosen = [row for row in rows if self._sampler.offer(row)]
        if trace:
            self._log([_record(row) for row in chosen])
        else:
            self._held.extend(chosen)  # at most the sampler's limit

    def _log(self, records: list[RolloutRecord]) -> None:
        if self._writer is not None and records:
            self._writer.log(records)


class _ParentGone(Exception):
    """The evaluation died: this process stops working on its run."""


def _lines(chunk: bytes) -> list[bytes]:
    return [line for line in chunk.split(b"\n") if line.strip()]


def _record(row: dict[str, Any]) -> RolloutRecord:
    from vfops._rollout import RolloutRecord

    return RolloutRecord.from_dict(row)


if __name__ == "__main__":
    code = 1
    try:
        code = main(sys.argv[1:])
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # MLflow's interpreter teardown costs hundreds of milliseconds the
        # parent would otherwise wait for; everything is flushed and committed.
        os._exit(code)
