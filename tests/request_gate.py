"""Hold an in-process stub model's answers, so a test arranges "mid-run" itself.

A test that kills a worker (or interrupts a run) "in the middle" must not bet on timing:
on a busy machine a run can finish between the test's last look and the kill, or the
look can miss a short window altogether. :class:`RequestGate` makes the middle a state:
while it is closed, each cell (what :attr:`key` tells apart: a sampling config, say)
gets ``allow`` chat requests answered, and every further one waits (the server holds
the HTTP request open) until the gate opens again. So a run stops partway, with some
rollouts done and none of the rest, for as long as the test needs.

It wraps the in-process :class:`~vfops.testing.StubServer`'s request handler; requests
still go over real HTTP to the real stub, which answers them as usual once let through.
Use it as a context manager inside the server's ``with`` (on exit it opens and takes
itself off the server, so the server never stops with requests held)::

    with StubServer(config) as stub, RequestGate(stub, allow=10, key=by_temperature) as gate:
        ...  # every cell stops after 10 model calls
        gate.open()
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Any

import orjson

from vfops.testing import StubServer

Key = Callable[[dict[str, Any]], Hashable]


def by_temperature(payload: dict[str, Any]) -> Hashable:
    """One key per sampling config that differs in temperature (a sweep's cells)."""
    return payload.get("temperature")


class RequestGate:
    def __init__(
        self,
        server: StubServer,
        *,
        allow: int = 0,
        key: Key = lambda payload: None,
        closed: bool = True,
    ) -> None:
        stub, loop = server._stub, server._loop
        if stub is None or loop is None:
            raise RuntimeError("RequestGate needs a started, in-process StubServer")
        self._loop = loop
        self.allow = allow
        self.key = key
        self.seen: Counter[Hashable] = Counter()
        """Chat requests that arrived, per key (held ones included)."""
        self.held = 0
        """Requests waiting at the gate now."""
        self._opened = self._call(self._new_event, set_it=not closed)
        answer = stub.chat_completions

        async def gated(request: Any) -> Any:
            # aiohttp keeps the body it read: the stub's handler reads it again
            payload = orjson.loads(await request.read())
            key = self.key(payload)
            self.seen[key] += 1
            if not self._opened.is_set() and self.seen[key] > self.allow:
                self.held += 1
                try:
                    await self._opened.wait()
                finally:
                    self.held -= 1
            return await answer(request)

        stub.chat_completions = gated  # type: ignore[method-assign]
        self._unwrap = lambda: setattr(stub, "chat_completions", answer)

    def _call(self, function: Callable[..., Any], **kwargs: Any) -> Any:
        """Run ``function`` on the server's event loop (where the gate's state lives)."""

        async def run() -> Any:
            return function(**kwargs)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    @staticmethod
    def _new_event(set_it: bool) -> asyncio.Event:
        event = asyncio.Event()
        if set_it:
            event.set()
        return event

    def close(self) -> None:
        """From now on, each key's requests past ``allow`` (counted from the start) wait."""

        def close() -> None:
            if self._opened.is_set():
                self._opened = asyncio.Event()

        self._call(close)

    def open(self) -> None:
        """Let every held request through, and all later ones."""
        self._call(lambda: self._opened.set())

    def stats(self) -> tuple[dict[Hashable, int], int]:
        """``(requests seen per key, requests held now)``, read on the server's loop."""
        return self._call(lambda: (dict(self.seen), self.held))  # type: ignore[no-any-return]

    def __enter__(self) -> RequestGate:
        return self

    def __exit__(self, *exc: object) -> None:
        """Open the gate and take it off the server (which may serve other tests)."""
        self.open()
        self._call(self._unwrap)
