"""``python -m vfops.registry._service_child``: an evaluation's registry process.

Started by :class:`vfops.registry.ProcessService`; serves its calls on
stdin/stdout until stdin closes. Logs and warnings go to stderr (the terminal of the
evaluation that started it).
"""

from __future__ import annotations

import os
import signal
import sys

from vfops.registry._service import serve


def main() -> None:
    # Ctrl-C (and a SIGTERM sent to the whole group) reach this process too: the
    # evaluation decides when to stop and still records the run's end through it.
    # It exits when the evaluation closes its stdin, or dies.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve(sys.stdin.buffer, sys.stdout.buffer)
    # every call was answered (each is one transaction, committed): nothing is left to
    # clean up, and the interpreter's teardown with SQLAlchemy loaded (~0.3 s) would
    # only keep the evaluation waiting for this process to exit
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
