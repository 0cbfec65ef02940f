"""The tracker: a child process that logs eval runs to MLflow while the evaluation runs.

Importing MLflow and opening its store costs over a second of CPU, more than a
short evaluation takes. The evaluation starts the tracker first, so that work
runs on another core while the environment loads and the rollouts run, and
keeps MLflow (and its memory) out of the evaluating process. At the end the
evaluation asks it to log the finished registry run and waits for the answer:
a run is never reported finished before it is in MLflow, and a tracker that
fails fails the run loudly.

The protocol is one JSON object per line: the child says ``{"ready": true}`` (or
``{"error": ...}``) once the store answers, then answers each
``{"op": "log", ...}`` with ``{"ok": true, "mlflow_run_id": ...}`` or
``{"ok": false, "error": ...}``; end of input ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from vfops._errors import VfopsError

_DATABASE_URL_VAR = "VFOPS_DATABASE_URL"
_READY_TIMEOUT_S = 120.0


class Tracker:
    """Parent side of the tracker process; see the module docstring."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self._ready: dict[str, Any] | None = None
        self._lock = asyncio.Lock()

    @classmethod
    async def start(cls, *, database_url: str | None, env_name: str) -> Tracker:
        """Spawn the tracker; returns at once (it gets ready in the background)."""
        env = dict(os.environ)
        if database_url is not None:
            # The child opens the same registry; the URL travels only in its environment.
            env[_DATABASE_URL_VAR] = database_url
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "vfops.tracking._tracker_main",
            env_name,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        return cls(process)

    async def _read(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = await self._process.stdout.readline()
        if not line:
            code = await self._process.wait()
            raise VfopsError(f"the tracker process exited (code {code}) before answering")
        answer: dict[str, Any] = orjson.loads(line)
        return answer

    async def wait_ready(self) -> None:
        """Wait until the tracking store answered; raise its one-line error otherwise."""
        if self._ready is None:
            self._ready = await asyncio.wait_for(self._read(), _READY_TIMEOUT_S)
        if "error" in self._ready:
            raise VfopsError(str(self._ready["error"]))

    async def log_run(
        self,
        run_id: str,
        *,
        parent_run_id: str | None = None,
        rollouts_file: str | Path | None = None,
    ) -> str:
        """Log registry run ``run_id`` (finished) to MLflow; return the MLflow run id."""
        async with self._lock:
            await self.wait_ready()
            command = {
                "op": "log",
                "run_id": run_id,
                "parent_run_id": parent_run_id,
                "rollouts_file": None if rollouts_file is None else str(rollouts_file),
            }
            assert self._process.stdin is not None
            self._process.stdin.write(orjson.dumps(command) + b"\n")
            await self._process.stdin.drain()
            answer = await self._read()
        if not answer.get("ok"):
            raise VfopsError(str(answer.get("error") or "the tracker failed"))
        return str(answer["mlflow_run_id"])

    async def aclose(self) -> None:
        """End the child (it exits on end of input) without waiting on its teardown."""
        stdin = self._process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await stdin.wait_closed()
        if self._process.returncode is None:
            try:
                await asyncio.wait_for(self._process.wait(), 10.0)
            except TimeoutError:
                self._process.kill()
                await self._process.wait()
