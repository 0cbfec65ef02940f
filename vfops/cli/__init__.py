"""The ``vfops`` command line (:mod:`vfops.cli._app`)."""

from __future__ import annotations

import os
import sys

__all__ = ["main"]

_NO_TRACKING_FLAGS = frozenset({"--no-tracking", "--no-registry", "--help", "-h"})


def _prestart_tracker(argv: list[str]) -> None:
    """``vfops eval ENV ...``: start the MLflow tracker process now.

    Its start-up (importing MLflow, opening the store) is the longest part of a
    short evaluation, which exits only once MLflow has the run; started before this
    process imports anything heavy, it runs on another core meanwhile. The
    evaluation adopts it (or, when the flags turn out to disagree, replaces it).
    """
    if len(argv) < 2 or argv[0] != "eval" or argv[1].startswith("-"):
        return
    if _NO_TRACKING_FLAGS.intersection(argv):
        return
    from vfops.tracking import prestart, tracking_enabled

    if tracking_enabled():
        # the registry calls are served in the same process (one interpreter and one
        # SQLAlchemy record the run): the name of vfops.evaluation._registry_calls'
        # SERVICE, written out here because importing it costs ~0.6 s
        prestart(argv[1], side_service="vfops.evaluation._registry_calls:serve")


def _exit_now(code: object) -> None:
    """Exit without the interpreter's teardown (a few hundred milliseconds of freeing
    the modules ``datasets`` and friends loaded). Only for ``vfops eval``: everything
    it writes is flushed or closed before it returns, and it leaves no atexit work."""
    import logging

    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    if code is None:
        os._exit(0)
    os._exit(code if isinstance(code, int) else 1)


def main() -> None:
    argv = sys.argv[1:]
    _prestart_tracker(argv)
    from vfops.cli._app import run

    if argv[:1] != ["eval"]:
        run()
        return
    try:
        run()
    except SystemExit as exc:
        _exit_now(exc.code)
    _exit_now(0)
