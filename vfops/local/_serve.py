"""``transformers serve`` as ``vfops model serve`` runs it: a server that stops cleanly.

``python -m vfops.local._serve serve DIR ...`` is ``transformers serve DIR ...`` with
one difference: SIGTERM and SIGINT end it through the interpreter's normal exit.

Why: uvicorn (the server under ``transformers serve``) answers SIGTERM by shutting
down, then raises the signal again under the handler it found at start. Python's
default for SIGTERM kills the process on the spot, so its exit handlers never run:
multiprocessing neither unlinks the semaphores of its queues to the model's process
nor stops that process, and Python's resource tracker, left holding them, warns
"There appear to be 7 leaked semaphore objects to clean up at shutdown" (measured
2026-12-06, transformers 5.2x). Raising :class:`SystemExit` instead lets the exit
handlers run: the queues' semaphores are unlinked and the model's process stopped.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Any

__all__ = ["main"]


def _exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main() -> None:
    """Run the ``transformers`` command line on this process's arguments."""
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, _exit)
    import importlib

    transformers_cli: Any = importlib.import_module("transformers.cli.transformers")
    sys.argv = ["transformers", *sys.argv[1:]]
    transformers_cli.main()


if __name__ == "__main__":
    main()
