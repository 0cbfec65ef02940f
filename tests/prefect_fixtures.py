"""One Prefect test harness per test module (it starts a server subprocess, ~9 s).

``harness`` reaches every test through ``pytest_plugins`` in ``tests/conftest.py``: take it
as an argument (or ``pytestmark = pytest.mark.usefixtures("harness")``), do not import it.
"""

from __future__ import annotations

import gc
import os
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

# before Prefect is imported anywhere: no telemetry, no ~/.prefect
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="vfops-prefect-home-"))


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    from prefect.events.worker import EventsWorker
    from prefect.settings import PREFECT_HOME, PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    home = tmp_path_factory.mktemp("prefect-home")
    updates: dict[Any, Any] = {PREFECT_HOME: str(home), PREFECT_SERVER_ANALYTICS_ENABLED: False}
    # a busy CI machine starts the server slowly (Prefect waits 30 s by default)
    with temporary_settings(updates=updates), prefect_test_harness(server_startup_timeout=180):
        yield
        # send emitted events before the server stops. Bounded: once, with the modules
        # in another order (three workers), the drain's future was never resolved (the
        # events worker idle on an empty queue) and the teardown waited until the
        # per-test hang catcher; the tests have checked what they need by now.
        EventsWorker.drain_all(timeout=60)
    # Prefect's own clients (lease renewal, events) drop sockets to the stopped server
    # for the garbage collector: collect them here, where that is known and expected,
    # rather than in whichever later test the collector happens to run.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


async def flow_run_artifacts(flow_run_id: UUID) -> dict[str, Any]:
    """The artifacts of a flow run, by key."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {artifact.key: artifact for artifact in artifacts}
