"""``vfops ARGS`` through the console script's entry point in this process: its exit code
and stderr, as a user sees them, at the cost of a function call (no interpreter start)."""

from __future__ import annotations

import io
import sys

import pytest

from vfops.cli._app import run


def run_vfops(args: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """(exit code, stderr) of ``vfops ARGS`` run by :func:`vfops.cli._app.run`."""
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "argv", ["vfops", *args])
    monkeypatch.setattr(sys, "stderr", stderr)
    code: int | str | None = 0
    try:
        run()
    except SystemExit as exit_:
        code = exit_.code
    return int(code or 0), stderr.getvalue()
