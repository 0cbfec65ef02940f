"""The generation event loop: asyncio in a background thread, driven from the trainer.

Light module (no torch). Generation is async (the environments' rollouts, the
backends' clients), training is a blocking torch loop: the recipe runs one event
loop in a daemon thread, submits coroutines to it and waits on their futures, so
generation proceeds while the main thread trains (``async_steps > 0``). With nothing
to overlap, :class:`MainThreadCompute` hands the backend's torch work back to the
waiting training thread instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any


class GenerationLoop:
    """One event loop in a daemon thread; :meth:`submit` and :meth:`run` from any other.

    ``max_concurrent`` bounds the rollouts in flight over every batch and eval at once
    (``[generation] max_concurrent``): :attr:`limiter` is shared by all of them.
    """

    def __init__(self, max_concurrent: int) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="vfops-generation", daemon=True
        )
        self._thread.start()
        self.main_compute: MainThreadCompute | None = None
        """Set when the backend's torch work should run on the waiting thread."""

        async def make_limiter() -> asyncio.Semaphore:
            return asyncio.Semaphore(max_concurrent)  # bound to this loop

        self.limiter: asyncio.Semaphore = self.run(make_limiter())

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        """Start ``coro`` on the loop; its future."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the loop and wait for its result."""
        return self.wait(self.submit(coro))

    def wait(self, future: concurrent.futures.Future[Any]) -> Any:
        """Wait for ``future``, running the backend's queued compute meanwhile if any."""
        if self.main_compute is None:
            return future.result()
        return self.main_compute.wait(future)

    def close(self, *closers: Callable[[], Awaitable[Any]]) -> None:
        """Run each ``closer()`` on the loop (errors ignored: this is shutdown), then stop it."""
        for closer in closers:
            with contextlib.suppress(Exception):
                self.run(_awaited(closer))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


async def _awaited(closer: Callable[[], Awaitable[Any]]) -> Any:
    return await closer()


class MainThreadCompute:
    """Runs the generation backend's torch work on the training thread while it waits.

    With ``async_steps = 0`` generation and training never overlap, so there is no
    reason to run torch on two threads: each thread running torch ops gets its own
    OpenMP team, and on a few cores the two teams slow each other down (measured:
    sampling took twice as long on a worker thread at 2 threads). The event loop
    still orchestrates rollouts; only the blocking compute is handed back here.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[
            tuple[Callable[..., Any], tuple[Any, ...], concurrent.futures.Future[Any]]
        ] = queue.SimpleQueue()

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Queue ``fn(*args)`` for the training thread; await its result."""
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put((fn, args, done))
        return await asyncio.wrap_future(done)

    def wait(self, future: concurrent.futures.Future[Any]) -> Any:
        """Block until ``future`` is done, running queued compute meanwhile."""
        while not future.done():
            try:
                fn, args, done = self._jobs.get(timeout=0.005)
            except queue.Empty:
                continue
            if not done.set_running_or_notify_cancel():
                continue
            try:
                done.set_result(fn(*args))
            except BaseException as exc:  # handed to the awaiting coroutine
                done.set_exception(exc)
        return future.result()
