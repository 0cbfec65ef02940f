"""Real HTTP servers on loopback for client tests, and free ports for the servers tests start.

One copy of each: the client tests and the model-connection tests both need an aiohttp
server that answers a route or two in the test's own event loop.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager

from aiohttp import web

from vfops._net import free_port

__all__ = ["Handler", "free_port", "loopback_server"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def loopback_server(routes: Mapping[tuple[str, str], Handler]) -> AsyncIterator[str]:
    """An aiohttp server on 127.0.0.1 (in this event loop) answering ``(method, path)``
    routes; yields its base URL, ``http://127.0.0.1:PORT/v1``. The socket is bound before
    the server starts, so there is no window in which another process takes the port."""
    app = web.Application()
    for (method, path), handler in routes.items():
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        await runner.cleanup()
