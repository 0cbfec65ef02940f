"""The ``vfops`` command line (:mod:`vfops.cli._app`)."""

from __future__ import annotations

import os
import sys

__all__ = ["main"]


def _exit_now(code: object) -> None:
    """End what the eval's environment started, then exit without the interpreter's
    teardown (a few hundred milliseconds of freeing the modules ``datasets`` and friends
    loaded). Only for ``vfops eval``: everything it writes is flushed or closed before it
    returns, and it leaves no atexit work."""
    import logging

    from vfops._descendants import end_descendants
    from vfops.sandbox import remove_live_containers

    # the tracker and the scoring workers have ended: what is left below is what the
    # environment's own code started (setsid daemons included, handed back here)
    end_descendants()
    # and the containers its sandboxes still hold (a warm pool's): atexit never runs here
    remove_live_containers()
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    if code is None:
        os._exit(0)
    os._exit(code if isinstance(code, int) else 1)


def main() -> None:
    from vfops.cli._app import run

    if sys.argv[1:2] != ["eval"]:
        run()
        return
    from vfops._descendants import become_subreaper

    # only here, in the process the command owns: a CLI call made inside another process
    # (a test's runner, a notebook) must not end that process's own children
    become_subreaper()
    try:
        run()
    except SystemExit as exc:
        _exit_now(exc.code)
    _exit_now(0)
