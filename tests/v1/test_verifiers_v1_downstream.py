"""A verifiers v1 taskset downstream of evaluation, as tests/test_verifiers_downstream.py
takes a classic ``verifiers`` environment: a sweep cell (SQLite and PostgreSQL, MLflow on,
a priced endpoint), a nightly run of a published taskset, a promotion gate.

The stub answers each ``v1_arith`` task with its ``ANSWER_HINT``, so each rollout's reward
is known from its own prompt: 1.0 where the hint is the answer, else 0.0.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

# before Prefect is imported: no telemetry, no ~/.prefect
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="vfops-prefect-home-"))

import pytest

from tests.env_fixtures import published_and_installed
from tests.model_fixtures import checkpoint
from tests.registry_fixtures import DIALECTS, database_url, stored_count, stored_rollouts
from vfops.registry import EvalRunRow, dispose_engines, get_engine, get_run, session_scope
from vfops.sweeps import SweepSpec
from vfops.testing import StubConfig, StubServer

pytestmark = [
    pytest.mark.tracking,  # MLflow on, as for every cell
    pytest.mark.filterwarnings(
        "ignore:The ``noload`` loader strategy is deprecated:DeprecationWarning"
    ),
]

N, R = 8, 2
LIBRARY_TAG = "verifiers-v1==0.4"
HINT = re.compile(r"ANSWER_HINT: (\d+)")


def registry_run(url: str, run_id: str) -> EvalRunRow:
    with session_scope(get_engine(url), write=False) as session:
        run = get_run(session, run_id, exact=True)
        assert run is not None, run_id
        session.expunge(run)
        return run


def assert_rewards_from_prompts(url: str, run_id: str, examples: int) -> None:
    """Every rollout scored by the taskset's own reward: 1.0 iff the stub's hint is right."""
    records = stored_rollouts(get_engine(url), run_id)
    assert sorted({r.example_id for r in records}) == list(range(examples))
    rewards = set()
    for record in records:
        hint = HINT.search(record.prompt[-1]["content"])
        assert hint is not None and record.error is None
        assert record.reward == float(hint.group(1) == record.answer), record
        assert record.info["task_hash"] and record.info["stop_condition"] == "agent_completed"
        rewards.add(record.reward)
    assert rewards == {0.0, 1.0}


def write_endpoints(path: Path, base_url: str, prices: str = "") -> Path:
    path.write_text(
        f'[[endpoint]]\nalias = "stub"\nmodel = "stub-model"\nbase_url = "{base_url}"\n' + prices
    )
    return path


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig()) as server:
        yield server


@pytest.fixture(params=DIALECTS)
def db_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    for url in database_url(request.param, tmp_path):
        monkeypatch.setenv("VFOPS_DATABASE_URL", url)
        yield url


async def test_a_v1_cell_runs_is_priced_and_is_reused_on_both_dialects(
    db_url: str, stub: StubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vfops.sweeps import run_cell_async, validate_sweep
    from vfops.tracking import RUN_ID_TAG, mlflow_client

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    prices = "input_price_per_mtok = 2.0\noutput_price_per_mtok = 8.0\n"
    endpoints = write_endpoints(tmp_path / "endpoints.toml", stub.base_url, prices)
    spec = SweepSpec(
        environments=["v1_arith"], endpoints=["stub"], endpoints_file=str(endpoints),
        num_examples=N, rollouts_per_example=R, max_concurrent=8,
    )  # fmt: skip
    (cell,) = validate_sweep(spec)
    before = stub.stats["requests"]
    first = await run_cell_async(cell, output_root=tmp_path / "out")
    assert (first.action, first.status, first.errors) == ("created", "completed", 0)
    assert first.rollouts == N * R == stored_count(get_engine(db_url), first.run_id)
    assert stub.stats["requests"] - before == N * R  # one model call a rollout
    run = registry_run(db_url, first.run_id)
    assert run.environment_name == "v1_arith" and run.environment_version == first.version
    assert any(tag.startswith(LIBRARY_TAG) for tag in run.tags), run.tags
    assert_rewards_from_prompts(db_url, first.run_id, N)
    # priced: each rollout's cost is its calls' usage at the endpoint's prices
    for record in stored_rollouts(get_engine(db_url), first.run_id):
        usage = record.usage
        expected = (usage.prompt_tokens * 2.0 + usage.completion_tokens * 8.0) / 1e6
        assert usage.cost_usd == pytest.approx(expected) and expected > 0
    tags = mlflow_client().get_run(first.mlflow_run_id).data.tags
    assert tags[RUN_ID_TAG] == run.id

    requests = stub.stats["requests"]
    second = await run_cell_async(cell, output_root=tmp_path / "out")
    assert second.action == "reused" and second.run_id == first.run_id
    assert stub.stats["requests"] == requests


async def test_an_infinite_and_a_two_agent_taskset_are_sweep_cells(
    db_url: str, stub: StubServer, tmp_path: Path
) -> None:
    """A sweep takes an infinite taskset with its num_examples (its first tasks) and a
    two-agent Env: every seat's trace of every episode is a stored rollout."""
    from vfops.sweeps import run_cell_async, validate_sweep

    endpoints = write_endpoints(tmp_path / "endpoints.toml", stub.base_url, "")
    spec = SweepSpec(
        environments=["v1_endless", "v1_duel"], endpoints=["stub"],
        endpoints_file=str(endpoints), num_examples=2, rollouts_per_example=2,
        max_concurrent=8,
    )  # fmt: skip
    for cell in validate_sweep(spec):
        done = await run_cell_async(cell, output_root=tmp_path / "out")
        assert (done.action, done.status) == ("created", "completed"), done
        records = stored_rollouts(get_engine(db_url), done.run_id)
        seats = {(r.example_id, r.episode, r.agent) for r in records}
        if cell.env_name == "v1_endless":  # its first 2 tasks, 2 episodes each, one trace
            assert {(e, p) for e, p, _ in seats} == {(e, p) for e in (0, 1) for p in (0, 1)}
        else:  # 2 hands x 2 episodes x both seats
            assert seats == {
                (e, p, a) for e in (0, 1) for p in (0, 1) for a in ("opener", "responder")
            }
        assert done.rollouts == len(records) == len(seats)


@pytest.fixture(scope="module")
def published_v1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """v1_arith renamed v1_night, published, then installed from the registry into a
    folder on sys.path: what ``nightly-eval`` evaluates at @latest."""
    root = tmp_path_factory.mktemp("v1-nightly")
    source = Path(__file__).resolve().parents[1] / "verifiers_v1_envs" / "v1_arith"
    package = root / "src" / "v1_night"
    shutil.copytree(source, package, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    (package / "v1_arith").rename(package / "v1_night")
    for path in (package / "pyproject.toml", *(package / "v1_night").glob("*.py")):
        text = path.read_text().replace("v1-arith", "v1-night").replace("v1_arith", "v1_night")
        path.write_text(text)
    with published_and_installed(root, package, "v1_night"):
        yield str(root)
    dispose_engines()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_published_v1_taskset_is_a_nightly_cell(
    harness: None, published_v1: str, stub: StubServer
) -> None:
    from vfops.flows.nightly import NightlyConfig, nightly_eval

    endpoints = write_endpoints(Path(published_v1) / "endpoints.toml", stub.base_url)
    url = f"sqlite:///{Path(published_v1) / 'registry.db'}"
    nights = []
    for night in ("2026-12-01", "2026-12-02"):
        config = NightlyConfig(
            environments=["v1_night"], endpoints=["stub"], endpoints_file=str(endpoints),
            num_examples=N, rollouts_per_example=R, date=night,
        )  # fmt: skip
        nights.append(await nightly_eval(config))
    first, second = (comparisons[0] for comparisons in nights)
    for comparison in (first, second):
        run = registry_run(url, comparison["run_id"])
        assert run.status == "completed" and run.environment_version == "0.1.0"
        assert run.environment_version_id is not None  # the published row
        assert "nightly" in run.tags and any(t.startswith(LIBRARY_TAG) for t in run.tags)
        assert_rewards_from_prompts(url, run.id, N)
    assert first["previous_run_id"] is None
    assert second["previous_run_id"] == first["run_id"]
    assert second["regressed"] is False


BREVITY = "v1_brevity_gate"


@pytest.fixture(scope="module")
def brevity_taskset(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A v1 taskset (a module and its dist-info on sys.path, requiring verifiers) whose
    reward favours short replies: a checkpoint capped at fewer tokens scores higher."""
    site = tmp_path_factory.mktemp("v1_gate_site")
    (site / f"{BREVITY}.py").write_text(
        textwrap.dedent(
            """
            import verifiers.v1 as vf


            class BrevityTask(vf.Task):
                @vf.reward
                async def brevity(self, trace: vf.Trace) -> float:
                    # the raw reply: the tiny model's greedy replies are whitespace
                    reply = trace.assistant_messages[-1].content or ""
                    return 1.0 / (1.0 + len(reply))


            class BrevityTaskset(vf.Taskset[BrevityTask, vf.TasksetConfig]):
                def load(self):
                    for i in range(12):
                        yield BrevityTask(vf.TaskData(prompt=f"Tell me about item {i}."))


            __all__ = ["BrevityTaskset"]
            """
        )
    )
    dist = site / f"{BREVITY}-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: v1-brevity-gate\nVersion: 0.0.1\n"
        "Requires-Dist: verifiers>=0.4\n"
    )
    (dist / "top_level.txt").write_text(f"{BREVITY}\n")
    sys.path.insert(0, str(site))
    import importlib

    importlib.invalidate_caches()
    yield BREVITY
    sys.path.remove(str(site))
    sys.modules.pop(BREVITY, None)


def test_a_v1_taskset_gates_a_promotion(
    tiny_base: Path, brevity_taskset: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vfops.envs import find_environment
    from vfops.models import PromotionRequest, promote, register_checkpoint
    from vfops.tracking import mlflow_client

    monkeypatch.setenv("VFOPS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    monkeypatch.setenv("VFOPS_DATABASE_URL", url)
    entry = find_environment(brevity_taskset)
    assert entry is not None and entry.library == "verifiers-v1"
    gate = {"gate_envs": [brevity_taskset], "num_examples": 6, "rollouts_per_example": 2,
            "sampling_args": {"temperature": 0.0}}  # fmt: skip

    v1 = register_checkpoint(checkpoint(tiny_base, tmp_path / "v1", 8), name="tiny")
    first = promote(PromotionRequest("tiny", v1.version, **gate))
    assert first.promoted and first.from_version is None, first.reason
    v2 = register_checkpoint(checkpoint(tiny_base, tmp_path / "v2", 32), name="tiny")
    second = promote(PromotionRequest("tiny", v2.version, **gate))
    assert not second.promoted and f"{brevity_taskset} regressed" in second.reason
    v3 = register_checkpoint(checkpoint(tiny_base, tmp_path / "v3", 2), name="tiny")
    third = promote(PromotionRequest("tiny", v3.version, **gate))
    assert third.promoted and third.from_version == "1", third.reason
    (result,) = third.envs
    assert result.verdict == "improvement" and result.candidate_errors == 0
    assert str(mlflow_client().get_model_version_by_alias("tiny", "champion").version) == "3"
    for record in stored_rollouts(get_engine(url), result.candidate_run_id):
        reply = record.completion[-1]["content"] or ""
        assert record.reward == pytest.approx(1.0 / (1.0 + len(reply)))
    dispose_engines()
