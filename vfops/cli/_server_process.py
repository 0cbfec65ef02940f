"""Run a server command in the foreground until it exits or Ctrl-C stops it."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence

import typer

_STOPPED = (0, -2, -15, 130)  # clean exit, SIGINT, SIGTERM, shell's Ctrl-C code


def run_server(cmd: Sequence[str], env: Mapping[str, str], *, grace_s: float) -> None:
    """Start ``cmd``; on Ctrl-C terminate it, killing it after ``grace_s``.

    Exits with the server's own code when it failed (not when it was stopped).
    """
    proc = subprocess.Popen(list(cmd), env=dict(env))
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
