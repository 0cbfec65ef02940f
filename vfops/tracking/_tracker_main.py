"""The tracker process (``python -m vfops.tracking._tracker_main ENV``); see
:mod:`vfops.tracking._tracker` for the protocol. Not imported by the package, so
running it as ``__main__`` does not import it twice."""

from __future__ import annotations

import os
import sys
from typing import Any

import orjson

# The protocol gets the original stdout to itself; anything a library prints
# (MLflow announces runs on stdout) goes to stderr instead.
_protocol = os.fdopen(os.dup(1), "wb", buffering=0)
os.dup2(2, 1)


def _answer(data: dict[str, Any]) -> None:
    _protocol.write(orjson.dumps(data) + b"\n")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def main(argv: list[str]) -> None:
    """Child side: open the store, then log runs until end of input."""
    from vfops.tracking import check_tracking, log_run_info, prepare_experiment

    try:
        check_tracking()
        if argv:
            prepare_experiment(argv[0])  # created now, while the rollouts run
    except Exception as exc:
        _answer({"error": _one_line(exc)})
        return
    _answer({"ready": True})
    for line in sys.stdin.buffer:
        command = orjson.loads(line)
        try:
            mlflow_run_id = log_run_info(
                command["info"],
                parent_run_id=command.get("parent_run_id"),
                rollouts_file=command["rollouts_file"],
            )
        except Exception as exc:
            _answer({"ok": False, "error": _one_line(exc)})
            continue
        _answer({"ok": True, "mlflow_run_id": mlflow_run_id})


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # MLflow's interpreter teardown costs hundreds of milliseconds the
        # parent would otherwise wait for; everything is flushed and committed.
        os._exit(0)
