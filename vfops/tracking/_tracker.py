"""The tracker: a child process that logs eval runs to MLflow while the evaluation runs.

Importing MLflow and opening its store costs over a second of CPU, more than a
short evaluation takes. The evaluation starts the tracker first (``vfops eval``
starts it before it even parses its flags: :func:`prestart`), so that work runs
on another core while the environment loads and the rollouts run, and MLflow
(and its memory) stays out of the evaluating process. At the end the evaluation
asks it to log the finished registry run and waits for the answer: a run is
never reported finished before it is in MLflow, and a tracker that fails fails
the run loudly.

The protocol is one JSON object per line: the child says ``{"ready": true}`` (or
``{"error": ...}``) once the store answers, then answers each
``{"op": "log", ...}`` with ``{"ok": true, "mlflow_run_id": ...}`` or
``{"ok": false, "error": ...}``; end of input ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import orjson

from vfops._errors import VfopsError

_READY_TIMEOUT_S = 120.0

_prestarted: Tracker | None = None
_prestarted_lock = threading.Lock()


class Tracker:
    """Parent side of the tracker process; see the module docstring."""

    def __init__(self, process: subprocess.Popen[bytes], *, env_name: str):
        self._process = process
        self.env_name = env_name
        self._ready: dict[str, Any] | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def spawn(cls, *, env_name: str) -> Tracker:
        """Start the tracker process; returns at once (it gets ready in the background).

        It talks to MLflow only (never to the registry: the evaluation reads the run
        and stores the link), so it imports nothing else heavy.
        """
        process = subprocess.Popen(
            [sys.executable, "-m", "vfops.tracking._tracker_main", env_name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        return cls(process, env_name=env_name)

    @classmethod
    def for_run(cls, *, env_name: str) -> Tracker:
        """The tracker started early for this evaluation (:func:`prestart`), else a new one."""
        global _prestarted
        with _prestarted_lock:
            early, _prestarted = _prestarted, None
        if early is not None:
            if early.env_name == env_name:
                return early
            early.kill()
        return cls.spawn(env_name=env_name)

    def _read_line(self) -> dict[str, Any]:
        stdout: IO[bytes] | None = self._process.stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            code = self._process.wait()
            raise VfopsError(f"the tracker process exited (code {code}) before answering")
        answer: dict[str, Any] = orjson.loads(line)
        return answer

    async def wait_ready(self) -> None:
        """Wait until the tracking store answered; raise its one-line error otherwise."""
        if self._ready is None:
            self._ready = await asyncio.wait_for(
                asyncio.to_thread(self._read_line), _READY_TIMEOUT_S
            )
        if "error" in self._ready:
            raise VfopsError(str(self._ready["error"]))

    async def log_run(
        self,
        info: dict[str, Any],
        *,
        rollouts_file: str | Path,
        parent_run_id: str | None = None,
    ) -> str:
        """Log a finished run (:func:`vfops.tracking.prepare_run_log`) and its rollouts
        file to MLflow; return the MLflow run id."""
        async with self._lock:
            await self.wait_ready()
            command = {
                "op": "log",
                "info": info,
                "parent_run_id": parent_run_id,
                "rollouts_file": str(rollouts_file),
            }
            answer = await asyncio.to_thread(self._send, command)
        if not answer.get("ok"):
            raise VfopsError(str(answer.get("error") or "the tracker failed"))
        return str(answer["mlflow_run_id"])

    def _send(self, command: dict[str, Any]) -> dict[str, Any]:
        stdin = self._process.stdin
        assert stdin is not None
        try:
            stdin.write(orjson.dumps(command) + b"\n")
            stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise VfopsError(f"the tracker process is gone ({exc})") from None
        return self._read_line()

    def kill(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self._process.stdin, self._process.stdout):
            if pipe is not None and not pipe.closed:
                with contextlib.suppress(OSError):
                    pipe.close()

    async def aclose(self) -> None:
        """End the child: it exits on end of input (and skips its slow teardown).

        A tracker that never logged anything (the evaluation failed early) is
        killed instead: it may still be importing MLflow.
        """
        if self._ready is None:
            self.kill()
            return
        stdin = self._process.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(OSError):
                stdin.close()
        try:
            await asyncio.wait_for(asyncio.to_thread(self._process.wait), 10.0)
        except TimeoutError:
            self.kill()
        self._close_pipes()


def prestart(env_name: str) -> None:
    """Start the tracker of an evaluation of ``env_name`` now, before the evaluation.

    ``vfops eval`` calls this before importing anything heavy; the evaluation then
    adopts it (:meth:`Tracker.for_run`). A tracker nobody adopts sees its input
    close when this process exits, and exits too.
    """
    global _prestarted
    tracker = Tracker.spawn(env_name=env_name)
    with _prestarted_lock:
        previous, _prestarted = _prestarted, tracker
    if previous is not None:
        previous.kill()
