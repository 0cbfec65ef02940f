"""The ``nightly-eval`` flow over three nights: a baseline, sampling noise, a planted drop."""

from __future__ import annotations

import asyncio
import os
import random
import re
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# before Prefect is imported: no telemetry, no ~/.prefect
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="vfops-prefect-home-"))

import pytest

from tests.env_fixtures import published_and_installed
from vfops.cli._env import init_environment
from vfops.registry import dispose_engines
from vfops.testing import StubConfig, StubServer

# Prefect's events client (emit_event) leaves its websocket sockets to the test
# server for the garbage collector; that is Prefect's, not ours.
pytestmark = [
    pytest.mark.tracking,  # what these tests check is in MLflow (tests/conftest.py)
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

N, R = 60, 4
_QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")


@pytest.fixture(scope="module")
def published_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A published environment, installed into a folder on sys.path (not the venv)."""
    root = tmp_path_factory.mktemp("nightly")
    package = init_environment("nightly_env", root / "src")
    with published_and_installed(root, package, "nightly_env"):
        yield str(root)
    dispose_engines()


def answer_with(p_correct: float, seed: int, drop_below: int = -1) -> Any:
    """A stub reply: right with probability p, always wrong when a < drop_below."""
    rng = random.Random(seed)

    def reply(request: dict[str, Any]) -> dict[str, Any]:
        a, b = map(int, _QUESTION.search(request["messages"][-1]["content"]).groups())  # type: ignore[union-attr]
        right = a >= drop_below and rng.random() < p_correct
        return {"role": "assistant", "content": f"<answer>{a + b if right else -1}</answer>"}

    return reply


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# one endpoint URL for every night: the base URL is part of a run's configuration
PORT = free_port()


async def run_night(
    root: str, night: str, reply: Any, **overrides: Any
) -> tuple[list[dict[str, Any]], str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from vfops.flows.nightly import NightlyConfig, nightly_eval

    with StubServer(StubConfig(reply_mode=reply), port=PORT) as stub:
        endpoints = Path(root) / "endpoints.toml"
        endpoints.write_text(
            f'[[endpoint]]\nalias = "stub"\nmodel = "stub-model"\nbase_url = "{stub.base_url}"\n'
        )
        config = NightlyConfig(
            environments=["nightly_env"],
            endpoints=["stub"],
            endpoints_file=str(endpoints),
            num_examples=N,
            rollouts_per_example=R,
            date=night,
            **overrides,
        )
        comparisons = await nightly_eval(config)
    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["nightly-eval-report"])),
            sort="CREATED_DESC",  # type: ignore[arg-type]
            limit=1,
        )
    return comparisons, str(artifacts[0].data)


async def test_three_nights(harness: None, published_env: str) -> None:
    first, _ = await run_night(published_env, "2026-11-01", answer_with(0.75, seed=1))
    assert [c["previous_run_id"] for c in first] == [None]

    noisy, noisy_report = await run_night(published_env, "2026-11-02", answer_with(0.75, seed=2))
    assert noisy[0]["previous_run_id"] == first[0]["run_id"]
    assert noisy[0]["regressed"] is False, noisy[0]["report"]["summary"]
    assert "noise floor" in noisy_report

    # the third night also archives the transcripts of every run finished before it ends
    dropped, report = await run_night(
        published_env,
        "2026-11-03",
        answer_with(0.75, seed=3, drop_below=40),
        archive_transcripts_after_days=0,
    )
    assert dropped[0]["previous_run_id"] == noisy[0]["run_id"]
    assert dropped[0]["regressed"] is True, dropped[0]["report"]["summary"]
    assert "REGRESSION" in dropped[0]["report"]["summary"]
    assert "regression" in report.lower() and "noise floor" in report

    # the regression reached Prefect as an event an automation can trigger on
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter
    from prefect.events.worker import EventsWorker

    await EventsWorker.drain_all()  # type: ignore[misc]
    async with get_client() as client:
        for _ in range(60):  # the server persists events in batches
            page = await client.read_events(
                filter=EventFilter(event=EventNameFilter(name=["vfops.nightly.regression"])),
                limit=50,
            )
            if page.events:
                break
            await asyncio.sleep(0.5)
    assert [e.resource.id for e in page.events] == [f"vfops.eval-run.{dropped[0]['run_id']}"]
    assert page.events[0].payload["report"]["regressed"] is True

    # the three runs' transcripts are in the artifact store, and read back from there
    from vfops.registry import EvalRunRow, get_engine, iter_rollouts, session_scope

    with session_scope(get_engine(), write=False) as session:
        for night in (first, noisy, dropped):
            run = session.get(EvalRunRow, night[0]["run_id"])
            assert run is not None and run.transcripts_uri is not None, night[0]["run_id"]
        records = list(iter_rollouts(session, first[0]["run_id"]))
    assert len(records) == N * R
    assert all(_QUESTION.search(r.prompt[-1]["content"]) for r in records)

    # rerunning the same night resumes/reuses its run instead of starting another
    again, _ = await run_night(published_env, "2026-11-03", answer_with(0.75, seed=4))
    assert again[0]["run_id"] == dropped[0]["run_id"]

    # every night's run went through the one evaluation path: each is an MLflow run
    # that names its registry run
    from vfops.registry import RunFilter, get_engine, list_runs, session_scope
    from vfops.tracking import RUN_ID_TAG, mlflow_client

    with session_scope(get_engine(), write=False) as session:
        links = [
            (run.id, run.mlflow_run_id)
            for run in list_runs(session, RunFilter(env_name="nightly_env"))
        ]
    assert len(links) == 3 and all(mlflow_id for _, mlflow_id in links)
    tracking = mlflow_client()
    for run_id, mlflow_id in links:
        assert tracking.get_run(mlflow_id).data.tags[RUN_ID_TAG] == run_id


@pytest.mark.filterwarnings(
    "ignore:The ``noload`` loader strategy is deprecated:DeprecationWarning"
)
async def test_nightly_evaluates_whoever_holds_champion(
    harness: None, published_env: str, tmp_path: Path
) -> None:
    """Each night pins ``models:/NAME@champion`` at its start and follows the alias."""
    from vfops.flows.nightly import NightlyConfig, nightly_eval
    from vfops.local import build_tiny_model
    from vfops.models import register_checkpoint
    from vfops.sweeps import SweepSpec, run_cell_async, validate_sweep
    from vfops.tracking import mlflow_client

    base = build_tiny_model(tmp_path / "tiny", seed=3)
    for _ in range(2):
        register_checkpoint(base, name="nightly-tiny")
    registry = mlflow_client()
    registry.set_registered_model_alias("nightly-tiny", "champion", "1")
    champion = "models:/nightly-tiny@champion"

    def config(night: str) -> NightlyConfig:
        return NightlyConfig(
            environments=["nightly_env"],
            endpoints=[champion],
            num_examples=6,
            rollouts_per_example=1,
            date=night,
        )

    first = await nightly_eval(config("2026-12-01"))
    assert [(c["model"], c["model_ref"], c["previous_run_id"]) for c in first] == [
        ("models:/nightly-tiny/1", champion, None)
    ]

    registry.set_registered_model_alias("nightly-tiny", "champion", "2")  # a promotion
    second = await nightly_eval(config("2026-12-02"))
    (cell,) = second
    assert cell["model"] == "models:/nightly-tiny/2"
    # compared with last night's champion, whichever version that was
    assert cell["previous_run_id"] == first[0]["run_id"]
    assert cell["previous_model"] == "models:/nightly-tiny/1"
    assert cell["report"] is not None
    assert "models:/nightly-tiny/1 -> models:/nightly-tiny/2" in cell["label"]

    # the alias is resolved once, when the sweep is validated: moving it while the
    # sweep runs does not change what the sweep evaluates
    (planned,) = validate_sweep(
        SweepSpec(environments=["nightly_env"], endpoints=[champion], num_examples=2)
    )
    assert (planned.endpoint, planned.model_ref) == ("models:/nightly-tiny/2", champion)
    registry.set_registered_model_alias("nightly-tiny", "champion", "1")
    result = await run_cell_async(planned)
    assert result.model == "models:/nightly-tiny/2" and result.rollouts == 2 * 3

    from vfops._errors import VfopsError

    with pytest.raises(VfopsError, match=r"models:/nobody@champion does not exist"):
        validate_sweep(
            SweepSpec(environments=["nightly_env"], endpoints=["models:/nobody@champion"])
        )
