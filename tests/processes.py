"""Stopping what a test started in a session of its own (``start_new_session=True``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def stop_process_group(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the process's group, SIGKILL after ``grace_s``, then SIGKILL again for
    children that outlived their parent (a server's workers, a shell's services)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
