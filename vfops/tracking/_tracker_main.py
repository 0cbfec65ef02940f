"""The tracker process (``python -m vfops.tracking._tracker_main ENV``); see
:mod:`vfops.tracking._tracker` for the protocol. Not imported by the package, so
running it as ``__main__`` does not import it twice."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from vfops.tracking._eval_runs import PendingTraces

# The protocol gets the original stdout to itself; anything a library prints
# (MLflow announces runs on stdout) goes to stderr instead.
_protocol = os.fdopen(os.dup(1), "wb", buffering=0)
os.dup2(2, 1)


def _answer(data: dict[str, Any]) -> None:
    # a broken pipe: the evaluation stopped listening (it handed its run off, or is gone)
    with contextlib.suppress(BrokenPipeError):
        _protocol.write(orjson.dumps(data) + b"\n")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def main(argv: list[str]) -> int:
    """Child side: open the store, then log runs until end of input.

    Returns the exit code: 1 when a run handed off to it (``"detach"``) could not
    be logged, so nobody else will report it.
    """
    from vfops.tracking import check_tracking, prepare_experiment

    try:
        check_tracking()
        if argv:
            prepare_experiment(argv[0])  # created now, while the rollouts run
    except Exception as exc:
        _answer({"error": _one_line(exc)})
        return _refuse_handed_off(_one_line(exc))
    _answer({"ready": True})
    for line in sys.stdin.buffer:
        command = orjson.loads(line)
        if command.get("detach"):
            return _log_handed_off(command)
        try:
            mlflow_run_id, traces = _log(command)
        except Exception as exc:
            _answer({"ok": False, "error": _one_line(exc)})
            continue
        # the evaluation goes on at once; the traces follow (it does not wait for them)
        _answer({"ok": True, "mlflow_run_id": mlflow_run_id, "traces": traces is not None})
        _log_traces(traces, command)
    return 0


def _log(command: dict[str, Any]) -> tuple[str, PendingTraces | None]:
    from vfops.tracking._eval_runs import log_run_deferring_traces

    return log_run_deferring_traces(
        command["info"],
        parent_run_id=command.get("parent_run_id"),
        rollouts_file=command["rollouts_file"],
    )


def _log_traces(traces: PendingTraces | None, command: dict[str, Any]) -> None:
    """Log a run's rollouts as traces; a failure is one line on stderr (the run itself
    is logged: traces are a view of it, not part of its record)."""
    if traces is None:
        return
    try:
        traces.log()
    except Exception as exc:
        run_id = command["info"].get("id", "?")
        sys.stderr.write(
            f"vfops: the rollouts of eval run {run_id} were not logged as MLflow traces "
            f"({_one_line(exc)}); the run itself is logged\n"
        )


def _log_handed_off(command: dict[str, Any]) -> int:
    """Log, link and clean up a run whose evaluation did not wait (it may have exited)."""
    link = command["link"]
    try:
        mlflow_run_id, traces = _log(command)
        from vfops.registry import get_engine, set_mlflow_run_id

        set_mlflow_run_id(get_engine(link["database_url"]), link["run_id"], mlflow_run_id)
    except Exception as exc:
        _say_not_logged(link["run_id"], command["info"], _one_line(exc))
        return 1
    finally:
        _clean_up(command)
    _log_traces(traces, command)
    return 0


def _refuse_handed_off(error: str) -> int:
    """The store did not open: a run handed off after that is reported on stderr."""
    for line in sys.stdin.buffer:
        command = orjson.loads(line)
        if command.get("detach"):
            _say_not_logged(command["link"]["run_id"], command["info"], error)
            _clean_up(command)
            return 1
    return 0


def _clean_up(command: dict[str, Any]) -> None:
    for path in command.get("cleanup", []):
        shutil.rmtree(path, ignore_errors=True)


def _say_not_logged(run_id: str, info: dict[str, Any], error: str) -> None:
    command = f"vfops eval {info.get('env_name', 'ENV')} -m {info.get('model', 'MODEL')} ..."
    sys.stderr.write(
        f"vfops: eval run {run_id} is recorded but not logged to MLflow ({error}); "
        f"fix MLFLOW_TRACKING_URI, then log it with: {command} --resume {run_id}\n"
    )


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
