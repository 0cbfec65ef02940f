"""The ``eval-sweep`` and ``publish-environment`` flows under one Prefect test harness.

One ``prefect_test_harness`` for the module (it starts a server subprocess, ~9 s);
the registry is SQLite in a temp folder (both dialects are covered by
test_sweeps.py), the model is the stub server behind an endpoints file.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# before Prefect is imported: no telemetry, no ~/.prefect
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="vfops-prefect-home-"))

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tests.prefect_fixtures import flow_run_artifacts
from tests.registry_fixtures import stored_count
from vfops.registry import EvalRunRow, dispose_engines, get_engine
from vfops.sweeps import SweepSpec
from vfops.testing import StubConfig, StubServer

REPO = Path(__file__).resolve().parent.parent
N, R = 3, 2


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('registry') / 'registry.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VFOPS_DATABASE_URL", url)
        patch.setenv("VFOPS_ARTIFACTS", tmp_path_factory.mktemp("artifacts").as_uri())
        patch.delenv("OPENAI_API_KEY", raising=False)
        yield url
    dispose_engines()


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(reply_mode="arithmetic")) as server:
        yield server


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory, stub: StubServer) -> Path:
    path = tmp_path_factory.mktemp("config") / "endpoints.toml"
    path.write_text(
        f'[[endpoint]]\nalias = "stub"\nmodel = "stub-model"\nbase_url = "{stub.base_url}"\n'
    )
    return path


def sweep_params(endpoints_toml: Path, output: Path, /, **overrides: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "environments": ["arithmetic", "guess_number"],
        "endpoints": ["stub"],
        "endpoints_file": str(endpoints_toml),
        "sampling": [{"name": "cold", "args": {"temperature": 0.0}}, {"name": "warm"}],
        "num_examples": N,
        "rollouts_per_example": R,
        "max_concurrent": 4,
        "env_args": {"arithmetic": {"num_examples": 5}, "guess_number": {"max_turns": 2}},
        "output_dir": str(output),
    }
    params.update(overrides)
    return params


def run_count(url: str) -> int:
    with Session(get_engine(url)) as session:
        return int(session.scalar(select(func.count()).select_from(EvalRunRow)) or 0)


def test_sweep_runs_every_cell_and_attaches_artifacts(
    harness: None, registry: str, endpoints: Path, stub: StubServer, tmp_path: Path
) -> None:
    from vfops.flows.eval_sweep import REPORT_KEY, TABLE_KEY, eval_sweep

    spec = SweepSpec.model_validate(sweep_params(endpoints, tmp_path / "out"))
    state = eval_sweep(spec=spec, return_state=True)
    assert state.is_completed(), state.message
    results = state.result()
    assert len(results) == 2 * 1 * 2
    assert {(r["env"], r["sampling"]) for r in results} == {
        (env, s) for env in ("arithmetic", "guess_number") for s in ("cold", "warm")
    }
    engine = get_engine(registry)
    for result in results:
        assert result["action"] == "created" and result["status"] == "completed"
        assert result["rollouts"] == N * R == stored_count(engine, result["run_id"])
    assert run_count(registry) == 4
    json.dumps(results)  # plain JSON all the way

    artifacts = asyncio.run(flow_run_artifacts(state.state_details.flow_run_id))
    # the chart is inside the report, not an image artifact of its own
    assert set(artifacts) == {TABLE_KEY, REPORT_KEY}
    table = artifacts[TABLE_KEY].data
    rows = json.loads(table) if isinstance(table, str) else table
    assert len(rows) == 4
    # the key columns only (the table fits the pane); the version in a column of its own
    assert list(rows[0]) == [
        "environment",
        "version",
        "model",
        "sampling",
        "reward",
        "rollouts",
        "errors",
        "cost",
    ]
    assert all(" ± " in row["reward"] and row["rollouts"] == N * R for row in rows)
    assert {row["cost"] for row in rows} == {"unpriced"}  # the stub alias has no prices
    assert {(row["environment"], row["model"]) for row in rows} == {
        ("arithmetic", "stub"),
        ("guess_number", "stub"),
    }
    report = artifacts[REPORT_KEY].data
    assert isinstance(report, str) and "arithmetic" in report
    assert "](data:image/png;base64," in report
    for result in results:  # the rest is in the report
        assert f"run `{result['run_id']}`" in report
        assert f"{result['env']}\\@{result['version']}" in report  # escaped: no mailto: link
    assert "rollouts (N×R)" in report and "pass\\@1" in report
    assert stub.base_url not in table and stub.base_url not in report

    # the same sweep again: every cell reuses its run, no model call, no new run
    before = stub.stats["requests"]
    again = eval_sweep(spec=spec, return_state=True)
    assert again.is_completed(), again.message
    assert {r["action"] for r in again.result()} == {"reused"}
    assert {r["run_id"] for r in again.result()} == {r["run_id"] for r in results}
    assert stub.stats["requests"] == before and run_count(registry) == 4


def test_a_failing_cell_fails_the_run_after_the_others_finish(
    harness: None,
    registry: str,
    endpoints: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import vfops.flows.eval_sweep as module

    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    file = tmp_path / "endpoints.toml"
    file.write_text(
        endpoints.read_text()
        + f'[[endpoint]]\nalias = "down"\nmodel = "m"\nbase_url = "http://127.0.0.1:{closed}/v1"\n'
    )
    monkeypatch.setattr(module, "run_cell", module.run_cell.with_options(retries=0))
    params = sweep_params(
        file,
        tmp_path,
        environments=["arithmetic"],
        endpoints=["stub", "down"],
        env_args={"arithmetic": {"num_examples": 5}},
        tags=["failing"],
    )
    state = module.eval_sweep(spec=params, return_state=True)
    assert state.is_failed()
    message = state.message or ""
    assert "1 of 4 cells failed" not in message and "2 of 4 cells failed" in message, message
    assert "arithmetic / down / cold" in message and "cannot reach" in message
    artifacts = asyncio.run(flow_run_artifacts(state.state_details.flow_run_id))
    rows = json.loads(artifacts[module.TABLE_KEY].data)
    assert sorted(row["reward"] for row in rows if row["model"] == "down") == ["failed"] * 2
    assert all(" ± " in row["reward"] for row in rows if row["model"] == "stub")
    report = artifacts[module.REPORT_KEY].data
    assert report.count("**failed**") == 2 and "cannot reach" in report


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"environments": ["no_such_env"]}, "unknown environment 'no_such_env'"),
        ({"endpoints": ["nope"]}, "unknown endpoint alias 'nope'"),
        ({"num_examples": 0}, "spec.num_examples: Input should be greater than 0"),
        ({"rollouts_per_example": -1}, "spec.rollouts_per_example: Input should be greater than 0"),
    ],
)
def test_bad_parameters_fail_fast(
    harness: None,
    registry: str,
    endpoints: Path,
    stub: StubServer,
    tmp_path: Path,
    overrides: dict[str, Any],
    expected: str,
) -> None:
    from vfops.flows.eval_sweep import eval_sweep

    before_requests, before_runs = stub.stats["requests"], run_count(registry)
    # a dict, as the UI form sends it: Prefect validates it into a SweepSpec
    params = sweep_params(endpoints, tmp_path, env_args={}, **overrides)
    state = eval_sweep(spec=params, return_state=True)
    assert state.is_failed()
    assert expected in (state.message or ""), state.message
    assert stub.stats["requests"] == before_requests
    assert run_count(registry) == before_runs


def test_publish_flow(harness: None, registry: str, tmp_path: Path) -> None:
    from vfops.flows.publish import REPORT_KEY, publish_environment_flow

    package = tmp_path / "arithmetic"
    shutil.copytree(
        REPO / "environments" / "arithmetic",
        package,
        ignore=shutil.ignore_patterns("*.egg-info", "build", "dist", "__pycache__", "tests"),
    )
    state = publish_environment_flow(path=str(package), return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    assert (result["env_name"], result["version"], result["status"]) == (
        "arithmetic",
        "0.1.0",
        "published",
    )
    artifacts = asyncio.run(flow_run_artifacts(state.state_details.flow_run_id))
    assert f"{REPORT_KEY}-arithmetic" in artifacts
    assert "arithmetic@0.1.0" in artifacts[f"{REPORT_KEY}-arithmetic"].data

    again = publish_environment_flow(path=str(package), return_state=True)
    assert again.result()["status"] == "unchanged"
    bad = publish_environment_flow(path=str(tmp_path / "missing"), return_state=True)
    assert bad.is_failed()


def test_cells_share_the_endpoint_budget(
    harness: None, registry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two cells in parallel against an endpoint that refuses more than R requests/s:
    the budget (a Prefect rate limit shared by both) keeps them under it together."""
    from vfops.flows.eval_sweep import eval_sweep

    rate = 10.0
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(f"[budget.limited]\nrequests_per_s = {rate}\n")
    monkeypatch.setenv("VFOPS_BUDGETS", str(budgets))
    with StubServer(StubConfig(reply_mode="arithmetic", rate_limit_per_s=rate)) as limited:
        endpoints = tmp_path / "endpoints.toml"
        endpoints.write_text(
            '[[endpoint]]\nalias = "limited"\nmodel = "stub-model"\n'
            f'base_url = "{limited.base_url}"\n'
        )
        spec = SweepSpec.model_validate(
            sweep_params(
                endpoints,
                tmp_path / "out",
                environments=["arithmetic"],
                endpoints=["limited"],
                num_examples=20,
                rollouts_per_example=2,
                max_concurrent=16,
                env_args={"arithmetic": {"num_examples": 20}},
            )
        )
        state = eval_sweep(spec=spec, return_state=True)
        assert state.is_completed(), state.message
        stats, times = limited.stats, sorted(limited.admitted_times)
    assert stats["ok"] == 2 * 20 * 2
    assert stats.get("rate_limited", 0) <= 2  # the budget, not the server, did the limiting
    achieved = (len(times) - 1) / (times[-1] - times[0])
    assert achieved <= rate * 1.1
