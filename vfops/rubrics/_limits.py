"""Time limits of reward function calls, and the threads sync reward functions run in.

A sync reward function called on the event loop blocks it: no other rollout, judge call
or signal handler runs until it returns (SIGINT and SIGTERM wait for it, forever if it
hangs). So the sync calls of each group run one after another in a scoring thread, and
the loop waits for them with a per-call time limit; async calls get the same limit
through :func:`asyncio.timeout`.

A thread cannot be killed. A call past its limit is abandoned: its thread leaves the
pool (a new one takes its place) and is asked to stop with an exception raised in it at
its next Python instruction (what math-verify's alarm does on the main thread), so a
pure-Python loop does not keep burning a core; a call blocked in C code (a lock, a
socket) does not see it until it returns. The threads are daemons: concurrent.futures'
are joined at interpreter exit (and ``asyncio.run`` joins its default executor's), so a
hung call there would keep the process from ever exiting; a daemon thread does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import os
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from typing import Any, Final

Call = tuple[Callable[..., Any], dict[str, Any]]
"""A function and its keyword arguments."""

_MAX_THREADS: Final = min(32, (os.cpu_count() or 1) + 4)
"""Scoring threads at most, not counting abandoned ones (concurrent.futures' default)."""


class _Stop(BaseException):
    """Raised in an abandoned call's thread; BaseException, so that the reward function's
    ``except Exception`` does not swallow it."""


class SyncOutcome:
    """What one sync call gave: its value, the exception it raised, or ``timed_out``."""

    __slots__ = ("error", "timed_out", "value")

    def __init__(
        self, value: Any = None, error: BaseException | None = None, timed_out: bool = False
    ) -> None:
        self.value = value
        self.error = error
        self.timed_out = timed_out


class _Job:
    """Calls that run one after another in one thread, and their progress."""

    __slots__ = (
        "abandoned",
        "call_started",
        "calls",
        "context",
        "done",
        "index",
        "lock",
        "loop",
        "queued",
        "results",
        "started",
        "worker",
    )

    def __init__(self, calls: list[Call], loop: asyncio.AbstractEventLoop) -> None:
        self.calls = calls
        self.loop = loop
        # the loop thread's context variables, as when the functions ran inline
        self.context = contextvars.copy_context()
        self.started: asyncio.Future[None] = loop.create_future()  # if queued
        self.done: asyncio.Future[None] = loop.create_future()
        self.results: list[SyncOutcome] = []
        self.lock = threading.Lock()
        self.index = 0  # the call running now (len(calls): none, all returned)
        self.call_started = time.monotonic()  # when it started (a thread takes it at once)
        self.queued = False  # waiting for a free thread: ``started`` says when it starts
        self.abandoned = False  # no further call runs; the thread leaves the pool
        self.worker: _Worker | None = None


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _post(job: _Job, future: asyncio.Future[None]) -> None:
    # a closed loop: nobody waits for this job any more
    with contextlib.suppress(RuntimeError):
        job.loop.call_soon_threadsafe(_resolve, future)


class _Worker(threading.Thread):
    def __init__(self, pool: _Pool, job: _Job) -> None:
        super().__init__(name="vfops-scoring", daemon=True)
        self._pool = pool
        self._inbox: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._inbox.put(job)
        self.abandoned = False

    def give(self, job: _Job) -> None:
        self._inbox.put(job)

    def run(self) -> None:
        try:
            job: _Job | None = self._inbox.get()
            while job is not None:
                self._run_job(job)
                if self.abandoned:
                    break
                # a waiting job, else idle: wait for the pool to give this thread one
                job = self._pool.next_job(self) or self._inbox.get()
        except _Stop:
            pass  # asked to stop just after its call returned
        finally:
            self._clear_stop()

    def _clear_stop(self) -> None:
        # At most one _Stop is ever sent to a thread (it is abandoned at once): clear
        # one still pending, so that it is not raised in threading's own code after
        # run() returns. It may be raised before the clearing call runs: then retry.
        while True:
            try:
                _send_stop(self, clear=True)
                return
            except _Stop:
                continue

    def _run_job(self, job: _Job) -> None:
        with job.lock:
            if job.abandoned:  # cancelled before it started
                return
            job.worker = self
            job.call_started = time.monotonic()
            announce = job.queued  # its caller waits for the start (read under the lock)
        if announce:
            _post(job, job.started)
        for func, kwargs in job.calls:
            try:
                outcome = SyncOutcome(value=job.context.run(func, **kwargs))
            except BaseException as exc:  # _Stop included: the caller has moved on
                outcome = SyncOutcome(error=exc)
            with job.lock:
                if job.abandoned:
                    return
                job.results.append(outcome)
                # the next call's clock starts now: no moment without a running call
                job.index += 1
                job.call_started = time.monotonic()
        _post(job, job.done)


def _send_stop(worker: threading.Thread, *, clear: bool = False) -> None:
    """Raise :class:`_Stop` in ``worker`` at its next Python instruction (CPython), or
    clear one pending (``clear``)."""
    ident = worker.ident
    if ident is None:
        return
    exc = ctypes.c_void_p(0) if clear else ctypes.py_object(_Stop)
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    set_async_exc(ctypes.c_ulong(ident), exc)


class _Pool:
    """Daemon threads that run jobs; at most ``max_threads`` not abandoned."""

    def __init__(self, max_threads: int) -> None:
        self._max = max_threads
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._pending: deque[_Job] = deque()
        self._threads = 0

    def submit(self, job: _Job) -> None:
        with self._lock:
            if self._idle:
                self._idle.pop().give(job)
            elif self._threads < self._max:
                self._start(job)
            else:
                job.queued = True
                self._pending.append(job)

    def _start(self, job: _Job) -> None:
        self._threads += 1
        _Worker(self, job).start()

    def next_job(self, worker: _Worker) -> _Job | None:
        """A waiting job for ``worker``, else None (it is now idle)."""
        with self._lock:
            if self._pending:
                return self._pending.popleft()
            self._idle.append(worker)
            return None

    def stop(self, job: _Job, *, started_before: float | None = None) -> int | None:
        """Abandon ``job``: none of its calls runs any more; the one running now is
        abandoned with its thread (a new thread takes its place) and its index returned.
        With ``started_before``, only if that call started before it: else (and when the
        job is finished or not started) nothing happens and None is returned."""
        with job.lock:
            worker = job.worker
            running = worker is not None and job.index < len(job.calls)
            if job.abandoned or (
                started_before is not None and not (running and job.call_started < started_before)
            ):
                return None
            job.abandoned = True
            if running:
                assert worker is not None
                # Under the job's lock, the thread is in the call or waiting for this lock
                # to record it: alive, and bound to pass its own ``except _Stop`` (once
                # it has left, its id may already belong to another thread).
                worker.abandoned = True
                _send_stop(worker)
            index = job.index
        if worker is None:  # not started: drop it if it is still waiting for a thread
            with self._lock, contextlib.suppress(ValueError):
                self._pending.remove(job)
            return None
        if not running:
            return None
        with self._lock:
            self._threads -= 1
            if self._pending:
                self._start(self._pending.popleft())
        return index

    @staticmethod
    def announce_start(job: _Job) -> bool:
        """Whether ``job`` has not started yet; if so its thread will resolve
        ``job.started`` when it does."""
        with job.lock:
            if job.worker is not None:
                return False
            job.queued = True
            return True


_POOL: Final = _Pool(_MAX_THREADS)


async def run_sync_calls(calls: list[Call], limit_s: float | None) -> list[SyncOutcome]:
    """Run ``func(**kwargs)`` of each call, in order, in a scoring thread; one outcome per
    call. A call that runs longer than ``limit_s`` (None: no limit) is ``timed_out`` and
    the rest run in another thread. Waiting for a free thread does not count."""
    loop = asyncio.get_running_loop()
    outcomes: list[SyncOutcome] = []
    while len(outcomes) < len(calls):
        job = _Job(calls[len(outcomes) :], loop)
        _POOL.submit(job)
        try:
            if job.queued:  # the wait for a thread does not count
                await job.started
            timed_out_at = await _watch(job, limit_s)
        except BaseException:  # cancelled (the run stops): nothing more of it runs
            _POOL.stop(job)
            raise
        if timed_out_at is None:
            outcomes.extend(job.results)
        else:
            outcomes.extend(job.results[:timed_out_at])
            outcomes.append(SyncOutcome(timed_out=True))
    return outcomes


async def _watch(job: _Job, limit_s: float | None) -> int | None:
    """Wait for ``job``; the index of the call that ran past ``limit_s``, or None."""
    if limit_s is None:
        await job.done
        return None
    while not job.done.done():
        left = job.call_started + limit_s - time.monotonic()
        if left > 0:
            # asyncio.wait: a timeout leaves the future alone (wait_for would cancel it)
            await asyncio.wait((job.done,), timeout=left)
            continue  # a later call may have started meanwhile: its own limit applies
        if _Pool.announce_start(job):  # its thread is slow to start: that does not count
            await job.started
            continue
        index = _POOL.stop(job, started_before=time.monotonic() - limit_s)
        if index is not None:
            return index
        if job.index == len(job.calls):  # it returned just now; job.done is on its way
            await job.done
    return None


# --- async calls ------------------------------------------------------------------------


class _Clock:
    """The limit of one async call, which judge calls pause (see :func:`not_counted`)."""

    __slots__ = ("_left", "_paused", "timeout")

    def __init__(self, timeout: asyncio.Timeout) -> None:
        self.timeout = timeout
        self._paused = 0
        self._left = 0.0

    def pause(self) -> None:
        self._paused += 1
        when = self.timeout.when()
        if self._paused == 1 and when is not None and not self.timeout.expired():
            self._left = max(0.0, when - asyncio.get_running_loop().time())
            with contextlib.suppress(RuntimeError):  # the call is over (Timeout exited)
                self.timeout.reschedule(None)

    def resume(self) -> None:
        self._paused -= 1
        if self._paused == 0 and self.timeout.when() is None and not self.timeout.expired():
            with contextlib.suppress(RuntimeError):  # the call is over (Timeout exited)
                self.timeout.reschedule(asyncio.get_running_loop().time() + self._left)


_CLOCK: ContextVar[_Clock | None] = ContextVar("vfops_scoring_clock", default=None)


@contextlib.asynccontextmanager
async def limited(limit_s: float | None) -> AsyncIterator[asyncio.Timeout]:
    """``asyncio.timeout(limit_s)`` for one async reward call (``expired()`` says whether
    it fired); judge calls inside it are not counted."""
    async with asyncio.timeout(limit_s) as timeout:
        token = _CLOCK.set(_Clock(timeout) if limit_s is not None else None)
        try:
            yield timeout
        finally:
            _CLOCK.reset(token)


@contextlib.contextmanager
def not_counted() -> Iterator[None]:
    """Time inside this block does not count against the reward call's limit: a judge
    call is bounded by its client's own timeout and retries, and waiting for one of the
    judge's few slots behind hundreds of rollouts is no sign of a hung function."""
    clock = _CLOCK.get()
    if clock is None:
        yield
        return
    clock.pause()
    try:
        yield
    finally:
        clock.resume()
