"""The tracker: a child process that records an eval run in MLflow while it runs.

Importing MLflow and opening its store costs over a second of CPU, more than a
short evaluation takes. The evaluation starts the tracker as soon as its environment
is loaded and checked (a refused one starts no tracker), so that work runs on another
core while the model is connected and the rollouts run, and MLflow (and its memory)
stays out of the evaluating process.

The run is recorded as it runs, so that little is left when the last rollout is
in: the MLflow run is opened (params, tags) as soon as the registry run is; the
rollouts are read from the run's ``results.jsonl`` as the evaluation appends them,
the sampled ones logged as traces and the statistics so far as metrics; at the end
the evaluation asks the tracker to finish (the rest of the rollouts, the rollouts
file as an artifact, the final metrics and status) and **waits for its answer**: a
run is never reported finished before it is in MLflow, in any process tree (a
container's PID 1 included: nothing is left to a process that outlives the
command). A tracker that fails fails the run loudly, with the ``--resume`` that
records it.

The protocol is one JSON object per line. The child says ``{"ready": true}`` (or
``{"error": ...}``) once the store answers, then reads:

* ``{"op": "open", "info": ..., "results": PATH, "parent_run_id": ...}``, answered
  ``{"opened": MLFLOW_RUN_ID}`` (or ``{"ok": false, "error": ...}``);
* ``{"op": "progress", "size": N, "summary": ..., "step": K}``: ``results.jsonl`` is
  ``N`` bytes long now; not answered;
* ``{"op": "seal", "size": N}``: complete the run's ``rollouts.arrow`` (``"export"`` of
  the open: the tracker writes it from ``results.jsonl``, so the evaluating process
  never imports pyarrow), answered ``{"sealed": true}``, ``{"export_error": ...}`` (the
  run folder could not take it) or ``{"ok": false, "error": ...}``;
* ``{"op": "finish", "info": ..., "size": N, "rollouts_file": PATH, "step": K}``,
  answered ``{"ok": true, "mlflow_run_id": ...}`` or ``{"ok": false, "error": ...}``;
  then it exits.

End of input without a finish (the evaluation was killed) ends the MLflow run as
``KILLED``, unless another evaluation holds the run by then. The tracker dies with
the evaluation: it runs no command once its parent is gone, and the run's next holder
waits for it to exit (:mod:`vfops.tracking._lifeline`). Messages are written by a
thread of the evaluation's, never by its event loop: a tracker that lags behind
(logging traces) cannot stall the rollouts, and progress messages it has not read
yet are replaced by newer ones.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import select
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from vfops._errors import VfopsError
from vfops.tracking._lifeline import RunTakenOver


class _Sender:
    """Writes the tracker's commands from a thread of its own, in order; a progress
    message still waiting is replaced by the next one (only the latest matters)."""

    def __init__(self, stdin: IO[bytes]) -> None:
        self._stdin = stdin
        self._queue: collections.deque[tuple[str, bytes | None]] = collections.deque()
        self._ready = threading.Condition()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="vfops-tracker-send", daemon=True)
        self._thread.start()

    def send(self, command: dict[str, Any]) -> None:
        kind = str(command.get("op"))
        data = orjson.dumps(command) + b"\n"
        with self._ready:
            if kind == "progress" and self._queue and self._queue[-1][0] == "progress":
                self._queue[-1] = (kind, data)
            else:
                self._queue.append((kind, data))
            self._ready.notify()

    def close(self) -> None:
        """Close the tracker's input once everything queued is written."""
        with self._ready:
            self._queue.append(("close", None))
            self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue:
                    self._ready.wait()
                _, data = self._queue.popleft()
            try:
                if data is None:
                    self._stdin.close()
                    return
                self._stdin.write(data)
                self._stdin.flush()
            except (BrokenPipeError, OSError, ValueError) as exc:
                self.error = self.error or f"the tracker process is gone ({exc})"
                with contextlib.suppress(OSError, ValueError):
                    self._stdin.close()
                return


@dataclass
class SideChannel:
    """The parent's ends of the pipes of a service the tracker process hosts besides
    tracking (``side_service`` of :meth:`Tracker.spawn`): ``write_fd`` to it,
    ``read_fd`` from it. Whoever takes it (:meth:`Tracker.take_side_channel`) closes it."""

    write_fd: int
    read_fd: int

    def close(self) -> None:
        for fd in (self.write_fd, self.read_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


class ExportError(VfopsError):
    """The tracker could not write the run's ``rollouts.arrow`` (its folder refused it)."""


class Tracker:
    """Parent side of the tracker process; see the module docstring."""

    def __init__(
        self, process: subprocess.Popen[bytes], *, env_name: str, side: SideChannel | None = None
    ):
        self._process = process
        self.env_name = env_name
        assert process.stdin is not None and process.stdout is not None
        self._stdout: IO[bytes] = process.stdout
        self._sender = _Sender(process.stdin)
        self._answers: list[dict[str, Any]] = []
        self._ready: dict[str, Any] | None = None
        self.failure: str | None = None
        """The first error the tracker reported (seen by :meth:`failed_now`)."""
        self.mlflow_run_id: str | None = None
        self._open_sent = False
        self._closed = False
        self._side = side

    @classmethod
    def spawn(cls, *, env_name: str, side_service: str | None = None) -> Tracker:
        """Start the tracker process; returns at once (it gets ready in the background).

        Tracking talks to MLflow only (the evaluation reads the registry run and stores
        the link). ``side_service`` (``"module:function"``, called as ``function(input,
        output)`` on binary files) is a service the same process runs in a thread of
        its own over a pair of pipes, :meth:`take_side_channel` their other ends:
        ``vfops eval`` has its registry calls served there, so one interpreter (and
        one SQLAlchemy: MLflow's store loads it anyway) records the run, not two. The
        process stays in this process's group and session: whatever ends this
        process's tree ends it too.
        """
        # --parent: the tracker ends with this process (see vfops.tracking._lifeline)
        command = [
            sys.executable, "-m", "vfops.tracking._tracker_main", env_name,
            "--parent", str(os.getpid()),
        ]  # fmt: skip
        theirs: tuple[int, ...] = ()
        side: SideChannel | None = None
        if side_service is not None:
            their_input, our_output = os.pipe()
            our_input, their_output = os.pipe()
            theirs = (their_input, their_output)
            side = SideChannel(write_fd=our_output, read_fd=our_input)
            command += ["--side-service", side_service, str(their_input), str(their_output)]
        try:
            process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=theirs
            )
        except BaseException:
            if side is not None:
                side.close()
            raise
        finally:
            for fd in theirs:  # the child has its copies; ours would keep the pipes open
                os.close(fd)
        return cls(process, env_name=env_name, side=side)

    def take_side_channel(self) -> SideChannel | None:
        """The side service's pipes (see :meth:`spawn`), handed over once; None without one."""
        side, self._side = self._side, None
        return side

    # ------------------------------------------------------------------ commands

    def open(
        self,
        info: dict[str, Any],
        *,
        results: Path | None,
        pass_threshold: float = 1.0,
        parent_run_id: str | None = None,
        export: Path | None = None,
        holder: str | None = None,
    ) -> None:
        """Open the MLflow run of ``info`` (:func:`vfops.tracking.run_info_json`), whose
        rollouts are appended to ``results`` (None: no traces; a rollout passes at
        ``pass_threshold``); ``export``: the ``rollouts.arrow`` the tracker writes from
        them (:meth:`seal` completes it); ``holder``: this evaluation's lease owner
        (the run's end is written only while the MLflow run's holder tag names it).
        Returns at once."""
        self._open_sent = True
        self._sender.send(
            {
                "op": "open",
                "info": info,
                "results": None if results is None else str(results),
                "pass_threshold": pass_threshold,
                "parent_run_id": parent_run_id,
                "export": None if export is None else str(export),
                "holder": holder,
            }
        )

    def progress(self, size: int, summary: dict[str, Any] | None, step: int) -> None:
        """``results.jsonl`` is ``size`` bytes long; ``summary``: the statistics so far."""
        self._sender.send({"op": "progress", "size": size, "summary": summary, "step": step})

    async def seal(self, size: int) -> None:
        """Have the tracker read ``results.jsonl`` up to ``size`` and complete the
        export; waits for it. Raises :class:`ExportError` when the run folder could not
        take it, :class:`VfopsError` with the tracker's one-line error otherwise."""
        failure = self.failed_now()
        if failure is not None:
            raise VfopsError(failure)
        self._sender.send({"op": "seal", "size": size})
        answer = await asyncio.to_thread(self._answer_with, "sealed", "export_error")
        if "export_error" in answer:
            raise ExportError(str(answer["export_error"]))
        if "sealed" not in answer:
            raise VfopsError(str(answer.get("error") or "the tracker failed"))

    def _answer_with(self, *keys: str) -> dict[str, Any]:
        while True:
            answer = self._read_line()
            if any(key in answer for key in keys) or "ok" in answer or "error" in answer:
                return answer

    async def finish(
        self,
        info: dict[str, Any],
        *,
        size: int,
        rollouts_file: str | Path | None,
        step: int,
    ) -> str:
        """Record how the run ended and wait until MLflow has everything; return the MLflow
        run id. Raises :class:`VfopsError` with the tracker's one-line error."""
        failure = self.failed_now()
        if failure is not None:
            self._sender.close()
            self._closed = True
            raise VfopsError(failure)
        self._sender.send(
            {
                "op": "finish",
                "info": info,
                "size": size,
                "rollouts_file": None if rollouts_file is None else str(rollouts_file),
                "step": step,
            }
        )
        self._sender.close()
        self._closed = True
        answer = await asyncio.to_thread(self._final_answer)
        if answer.get("taken_over"):
            raise RunTakenOver(str(self.mlflow_run_id), str(answer["taken_over"]))
        if not answer.get("ok"):
            raise VfopsError(str(answer.get("error") or "the tracker failed"))
        self.mlflow_run_id = str(answer["mlflow_run_id"])
        return self.mlflow_run_id

    def _final_answer(self) -> dict[str, Any]:
        while True:
            answer = self._read_line()
            if "ok" in answer or "error" in answer:
                return answer if "ok" in answer else {**answer, "ok": False}

    # ------------------------------------------------------------------ answers

    def _read_line(self) -> dict[str, Any]:
        line = self._stdout.readline()
        if not line:
            code = self._process.wait()
            problem = self._sender.error or f"the tracker process exited (code {code})"
            return {"ok": False, "error": f"{problem} before answering"}
        answer: dict[str, Any] = orjson.loads(line)
        if self._ready is None:
            self._ready = answer
        if "opened" in answer:
            self.mlflow_run_id = str(answer["opened"])
        error = answer.get("error")
        if error is not None and self.failure is None:
            self.failure = str(error)
        return answer

    def failed_now(self) -> str | None:
        """The tracker's error if it has reported one already; never waits (the answers
        it wrote meanwhile are read, none is lost for :meth:`finish`)."""
        while self.failure is None and not self._closed:
            readable, _, _ = select.select([self._stdout], [], [], 0)
            if not readable:
                break
            answer = self._read_line()
            if "ok" in answer and not answer["ok"] and self.failure is None:
                self.failure = str(answer.get("error"))
        return self.failure or self._sender.error

    # ------------------------------------------------------------------ ending

    def kill(self) -> None:
        self._close_side()
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        self._close_pipes()

    def _close_side(self) -> None:
        # a side channel nobody took: its service sees its input close and returns
        side = self.take_side_channel()
        if side is not None:
            side.close()

    def _close_pipes(self) -> None:
        for pipe in (self._process.stdin, self._process.stdout):
            if pipe is not None and not pipe.closed:
                with contextlib.suppress(OSError):
                    pipe.close()

    async def aclose(self) -> None:
        """End the child. After :meth:`finish` it exits by itself at once; one asked to
        open a run but not to finish it sees its input close and ends that run as
        ``KILLED``; one never asked anything (the evaluation failed early) is killed: it
        may still be importing MLflow."""
        if not self._open_sent:
            self.kill()
            return
        self._close_side()
        if not self._closed:
            self._sender.close()
            self._closed = True
        try:
            await asyncio.wait_for(asyncio.to_thread(self._process.wait), 60.0)
        except TimeoutError:
            self.kill()
        self._close_pipes()
