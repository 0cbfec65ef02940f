"""Sandbox containers across workers: a sweep cell's containers each hold a slot of a
Prefect global concurrency limit (``sandbox-containers``), on a real Prefect server, so
a fleet never starts more than the limit; a slot is given back when its container goes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.sandbox_fixtures import base_image
from vfops.orchestration import PrefectFleetGate, prefect_client
from vfops.sandbox import Sandbox, SandboxLimits, fleet_gate_scope

__all__ = ["base_image"]

pytestmark = pytest.mark.usefixtures("harness")


async def active_slots(name: str) -> int:
    async with prefect_client() as client:
        limit = await client.read_global_concurrency_limit_by_name(name)
        return int(limit.active_slots)


async def test_the_fleet_limit_holds_back_a_container_until_one_goes(
    base_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VFOPS_SANDBOX_STATE_DIR", str(tmp_path / "state"))  # host: plenty
    gate = PrefectFleetGate("sandbox-fleet-test", limit=1)
    limits = SandboxLimits(memory_mb=128, wall_s=5)
    with fleet_gate_scope(gate):
        first = Sandbox(image=base_image, limits=limits)
        await first.start()
        assert await active_slots("sandbox-fleet-test") == 1
        second = Sandbox(image=base_image, limits=limits)
        waiting = asyncio.ensure_future(second.start())
        done, _ = await asyncio.wait([waiting], timeout=2.0)
        assert not done  # the fleet is full: held back, not started
        assert second.container is None
        await first.close()
        await waiting  # its slot came back: the second starts
        assert await active_slots("sandbox-fleet-test") == 1
        assert (await second.run("echo ok")).stdout == "ok\n"
        await second.close()
    assert await active_slots("sandbox-fleet-test") == 0
