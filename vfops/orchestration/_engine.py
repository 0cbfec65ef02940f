"""A flow run's process: Prefect's engine, started and ended sooner.

``python -m vfops.orchestration._engine`` is the command the local stack's work pool
gives its process workers (:func:`vfops.orchestration.engine_command`). It runs
``prefect.engine`` exactly as ``python -m prefect.engine`` would (the flow run's id in
``PREFECT__FLOW_RUN_ID``, the deployment's pull steps, the flow, its final state), with
two differences, both measured on 2 cores (infra/README.md, "Cells that start in
seconds"):

- the cyclic garbage collector is off while Prefect's engine imports (tens of thousands
  of objects that live as long as the process; a collection finds nothing to free),
  then :func:`gc.freeze` keeps them out of every later collection: ~0.1 s of the start;
- once the engine has returned (the run's final state is recorded) and Python's own
  shutdown work has run (non-daemon threads joined, ``atexit`` handlers: Prefect drains
  its log and event queues there), the process ends with :func:`os._exit` instead of
  tearing down its ~2,000 modules one object at a time: 0.3 s on an idle machine, up to
  ~1 s on a busy one, during which the worker's slot stays taken for nothing.

Anything the engine raises other than ``SystemExit`` ends the process the usual way.
"""

from __future__ import annotations

import atexit
import gc
import os
import runpy
import sys
import threading
from typing import Any


def _exit_code(code: Any) -> int:
    """``SystemExit.code`` as the interpreter turns it into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def main() -> None:
    gc.disable()
    # what the run below imports first, here without the collector
    import prefect.engine
    import prefect.flow_engine  # noqa: F401

    gc.freeze()
    gc.enable()
    try:
        runpy.run_module("prefect.engine", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:  # the engine ends with exit(0) / exit(1) itself
        code = _exit_code(exc.code)
    # what the interpreter does at exit before its teardown: join the threads that are
    # not daemons (and run threading's own exit hooks), then the atexit handlers
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
