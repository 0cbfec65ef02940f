"""Run a server command in the foreground until it exits or Ctrl-C stops it."""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from types import FrameType

import typer

_STOPPED = (0, -2, -15, 130)  # clean exit, SIGINT, SIGTERM, shell's Ctrl-C code


def run_server(cmd: Sequence[str], env: Mapping[str, str], *, grace_s: float) -> None:
    """Start ``cmd``; on Ctrl-C terminate it, killing it after ``grace_s``.

    Exits with the server's own code when it failed (not when it was stopped).
    """
    proc = subprocess.Popen(list(cmd), env=dict(env))
    if threading.current_thread() is threading.main_thread():
        # a supervisor's SIGTERM (systemd, Kubernetes, kill) must not orphan the server
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            code = proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    if code not in _STOPPED:
        raise typer.Exit(code)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
