"""Test helpers: an OpenAI-compatible stub server with latency and fault injection."""

from vfops.testing._stub_server import StubConfig, StubServer, run_stub_server

__all__ = ["StubConfig", "StubServer", "run_stub_server"]
