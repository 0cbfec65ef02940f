"""The tracker: a child process that logs eval runs to MLflow while the evaluation runs.

Importing MLflow and opening its store costs over a second of CPU, more than a
short evaluation takes. The evaluation starts the tracker first (``vfops eval``
starts it before it even parses its flags: :func:`prestart`), so that work runs
on another core while the environment loads and the rollouts run, and MLflow
(and its memory) stays out of the evaluating process. At the end the evaluation
asks it to log the finished registry run and waits for the answer: a run is
never reported finished before it is in MLflow, and a tracker that fails fails
the run loudly.

A process that exits right after the evaluation (``vfops eval``) may instead
*hand off* the finished run (:meth:`Tracker.hand_off`): the tracker logs it,
links the registry run to its MLflow run and exits on its own, in its own
session, while the prompt is already back. A short evaluation otherwise spends
most of its wall time waiting for MLflow's imports. What it cannot log it says
on the inherited stderr in one line, with the command that logs it later
(``--resume`` of the completed run logs it again, idempotently).

The protocol is one JSON object per line: the child says ``{"ready": true}`` (or
``{"error": ...}``) once the store answers, then answers each
``{"op": "log", ...}`` with ``{"ok": true, "mlflow_run_id": ...}`` or
``{"ok": false, "error": ...}`` (``"traces": true``: it logs the run's rollouts as
traces next, and nobody waits for that); end of input ends it. A log command with
``"detach": true`` (the last one, input closed after it) gets no answer: the
child links the run itself (``"link"``: database URL and run id) and removes
its ``"cleanup"`` paths.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import select
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

_handed_off: list[subprocess.Popen[bytes]] = []
"""Trackers finishing on their own. A process that exits normally waits for them
(:func:`_wait_for_handed_off`); ``vfops eval`` leaves with ``os._exit`` and does not."""

_HANDED_OFF_EXIT_WAIT_S = 60.0


def _wait_for_handed_off() -> None:
    wait_for_trackers(_HANDED_OFF_EXIT_WAIT_S)


def wait_for_trackers(timeout_s: float = _HANDED_OFF_EXIT_WAIT_S) -> bool:
    """Wait until every tracker this process left to finish on its own (a handed-off run,
    traces being logged) has exited, ``timeout_s`` at most each; False if one has not."""
    done = True
    for process in list(_handed_off):
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            done = False
        else:
            _handed_off.remove(process)
    return done


atexit.register(_wait_for_handed_off)


class Tracker:
    """Parent side of the tracker process; see the module docstring."""

    def __init__(self, process: subprocess.Popen[bytes], *, env_name: str):
        self._process = process
        self.env_name = env_name
        self._ready: dict[str, Any] | None = None
        self._lock = asyncio.Lock()
        self._handed_off = False
        self._logging_traces = False
        """It answered a log command and is logging that run's traces (nobody waits)."""

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
            # its own session: a tracker handed a run keeps going when the
            # evaluation's process group is signalled after it exited
            start_new_session=True,
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
        self._logging_traces = self._logging_traces or bool(answer.get("traces"))
        return str(answer["mlflow_run_id"])

    def ready_error_now(self) -> str | None:
        """The tracker's start-up error if it has already reported one; never waits."""
        if self._ready is None:
            stdout = self._process.stdout
            assert stdout is not None
            readable, _, _ = select.select([stdout], [], [], 0)
            if not readable:
                return None
            self._ready = self._read_line()
        error = self._ready.get("error")
        return None if error is None else str(error)

    async def hand_off(
        self,
        info: dict[str, Any],
        *,
        rollouts_file: str | Path,
        database_url: str,
        run_id: str,
        parent_run_id: str | None = None,
        cleanup: list[str] | None = None,
    ) -> None:
        """Give the tracker the finished run to log, link (registry run ``run_id`` in
        ``database_url``) and clean up after, and let it finish alone; see the module
        docstring. Returns once the command is written (at once unless it is larger than
        the pipe's buffer and the tracker is still starting)."""
        command = {
            "op": "log",
            "info": info,
            "parent_run_id": parent_run_id,
            "rollouts_file": str(rollouts_file),
            "detach": True,
            "link": {"database_url": database_url, "run_id": run_id},
            "cleanup": list(cleanup or []),
        }
        async with self._lock:
            await asyncio.to_thread(self._write, command, close=True)
            self._handed_off = True
            _handed_off.append(self._process)
            stdout = self._process.stdout
            if stdout is not None:
                stdout.close()

    def _write(self, command: dict[str, Any], *, close: bool = False) -> None:
        stdin = self._process.stdin
        assert stdin is not None
        try:
            stdin.write(orjson.dumps(command) + b"\n")
            stdin.flush()
            if close:
                stdin.close()
        except (BrokenPipeError, OSError) as exc:
            raise VfopsError(f"the tracker process is gone ({exc})") from None

    def _send(self, command: dict[str, Any]) -> dict[str, Any]:
        self._write(command)
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
        killed instead: it may still be importing MLflow. One handed a run, or
        logging the traces of the run it logged, is left to finish it.
        """
        if self._handed_off:
            return
        if self._ready is None:
            self.kill()
            return
        stdin = self._process.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(OSError):
                stdin.close()
        if self._logging_traces:
            # it exits once the traces are logged; a process that exits waits for it
            _handed_off.append(self._process)
            self._handed_off = True
            stdout = self._process.stdout
            if stdout is not None:
                stdout.close()
            return
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
