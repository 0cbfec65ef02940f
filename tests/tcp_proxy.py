"""A TCP proxy for fault tests: put it in front of a server, cut it, restore it.

While cut, every open connection is closed and new ones are accepted and closed
at once: to a client the server "stops accepting connections" (PostgreSQL gone
mid-session), as a real outage does, without touching the real server.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target``; a context manager that stops it."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self.refused = 0
        """Connections accepted and closed while cut."""
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def cut(self) -> None:
        """Close every connection and refuse new ones until :meth:`restore`."""
        self._cut.set()
        self._close_all()

    def restore(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        self._listener.close()
        self._close_all()

    def _close_all(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._cut.is_set():
                self.refused += 1
                client.close()
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:  # one side ended: end both, as a dropped connection does
            with self._lock:
                self._sockets -= {source, sink}
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
