"""Loopback ports for the servers vfops starts (vLLM, the MLflow tracker, the stack)."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port free on ``address`` now. The caller binds it soon after: another process
    may take it in between, which the servers' own start-up checks report."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])
