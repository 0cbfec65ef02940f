"""MLflow tracking of eval runs: the embedded SQLite store and a real ``mlflow server``
on loopback whose artifacts go to S3 on moto."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# before Prefect is imported (by the sweep flow test): no telemetry, no ~/.prefect
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="vfops-prefect-home-"))

import pyarrow.parquet as pq
import pytest

from tests.mlflow_fixtures import Backend, fake_aws_env
from tests.registry_fixtures import make_error_record, make_record, store_rollouts
from tests.s3_fixtures import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY, FAKE_SESSION_TOKEN
from vfops._net import free_port
from vfops.registry import (
    NewRun,
    create_run,
    finish_run,
    get_engine,
    get_run,
    session_scope,
)
from vfops.testing import StubConfig, StubServer
from vfops.tracking import (
    RUN_ID_TAG,
    finish_sweep_runs,
    log_eval_run,
    mlflow_client,
    start_sweep_runs,
    tracking_uri,
)

pytestmark = pytest.mark.tracking  # what these tests check is in MLflow (tests/conftest.py)

VFOPS = str(Path(sys.executable).parent / "vfops")
FAKE_OPENAI_KEY = "sk-fake-openai-9f8e7d-never-log-me"
SECRETS = (FAKE_OPENAI_KEY, FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY, FAKE_SESSION_TOKEN)


def _registry_run(engine: Any, *, examples: int = 3, rollouts: int = 2) -> str:
    with session_scope(engine) as session:
        run = create_run(
            session,
            NewRun(
                environment_name="arithmetic",
                environment_version="1.2.0",
                environment_content_hash="ab" * 32,
                model="test-model",
                base_url="http://127.0.0.1:9/v1",
                sampling_args={"temperature": 0.7, "max_tokens": 64, "extra_body": {"top_k": 5}},
                env_args={"difficulty": "hard"},
                num_examples=examples,
                rollouts_per_example=rollouts,
                config_fingerprint="f" * 64,
            ),
        )
        run_id = run.id
    records = [make_record(e, r) for e in range(examples) for r in range(rollouts)]
    records.append(make_error_record(examples, 0))
    store_rollouts(engine, run_id, records)
    with session_scope(engine) as session:
        finish_run(
            session,
            run_id,
            "completed",
            {"wall_s": 2.0, "rollouts_per_s": 3.5, "pass_threshold": 1.0},
        )
    return run_id


def _registry_mlflow_id(engine: Any, run_id: str) -> str | None:
    with session_scope(engine, write=False) as session:
        row = get_run(session, run_id)
        assert row is not None
        return row.mlflow_run_id


def test_tracking_uri_defaults_to_an_embedded_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VFOPS_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri() == f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    assert tracking_uri() == "http://mlflow.example:5000"


def test_a_store_without_a_server_keeps_artifacts_under_vfops_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eval runs, training runs and checkpoints share one experiment helper: a configured
    SQLite store is opened in-process too, so its artifacts must not land in ./mlruns."""
    from vfops.tracking import ensure_experiment, is_embedded

    monkeypatch.setenv("VFOPS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("VFOPS_MLFLOW_ARTIFACTS", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'elsewhere.db'}")
    assert is_embedded()
    assert not is_embedded("http://mlflow.example:5000")
    client = mlflow_client()
    artifacts = (tmp_path / "home" / "mlflow" / "artifacts").as_uri()

    shared = ensure_experiment(client, "vfops-checkpoints")
    assert client.get_experiment(shared).artifact_location == artifacts
    per_env = ensure_experiment(client, "vfops/arithmetic", artifact_folder="arithmetic")
    assert client.get_experiment(per_env).artifact_location == f"{artifacts}/arithmetic"
    client.delete_experiment(shared)
    assert ensure_experiment(client, "vfops-checkpoints") == shared
    assert client.get_experiment(shared).lifecycle_stage == "active"

    monkeypatch.setenv("VFOPS_MLFLOW_ARTIFACTS", "s3://bucket/prefix/")
    moved = ensure_experiment(client, "vfops/other", artifact_folder="other")
    assert client.get_experiment(moved).artifact_location == "s3://bucket/prefix/other"


def test_importing_tracking_does_not_import_mlflow() -> None:
    code = "import sys, vfops, vfops.tracking; assert 'mlflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_eval_run_appears_in_mlflow(backend: Backend, tmp_path: Path) -> None:
    engine = get_engine(f"sqlite:///{tmp_path / 'registry.db'}")
    run_id = _registry_run(engine)

    mlflow_id = log_eval_run(engine, run_id)

    assert _registry_mlflow_id(engine, run_id) == mlflow_id
    client = mlflow_client()
    run = client.get_run(mlflow_id)
    assert run.data.tags[RUN_ID_TAG] == run_id
    assert "vfops.version" in run.data.tags
    assert run.info.status == "FINISHED"
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.name == "vfops/arithmetic"
    params = run.data.params
    assert params["environment"] == "arithmetic"
    assert params["environment_version"] == "1.2.0"
    assert params["environment_code_hash"] == "ab" * 32
    assert params["model"] == "test-model"
    assert params["sampling.temperature"] == "0.7"
    assert params["sampling.max_tokens"] == "64"
    assert params["sampling.extra_body.top_k"] == "5"
    assert params["env_args.difficulty"] == "hard"
    assert params["num_examples"] == "3" and params["rollouts_per_example"] == "2"
    assert not any("base_url" in key for key in params)
    metrics = run.data.metrics
    # 6 scored rollouts (1.0 / 0.25 alternating) and one error
    assert metrics["rollouts"] == 7 and metrics["errors"] == 1
    assert metrics["error_rate"] == pytest.approx(1 / 7)
    assert metrics["reward_mean"] == pytest.approx(0.625)
    assert metrics["reward_stderr"] > 0
    assert metrics["metric/correct"] == 1.0 and metrics["metric/format"] == 0.5
    # An errored rollout is no attempt: example 3 (its one rollout errored)
    # has nothing scored and stays out, so examples 0-2 give 1/2 each.
    assert metrics["pass_at_1"] == pytest.approx(1 / 2)
    assert metrics["prompt_tokens"] == 7 * 31 and metrics["completion_tokens"] == 7 * 7
    assert metrics["rollouts_per_s"] == 3.5

    artifacts = [a.path for a in client.list_artifacts(mlflow_id)]
    assert artifacts == ["rollouts.parquet"]
    local = client.download_artifacts(mlflow_id, "rollouts.parquet", str(tmp_path))
    table = pq.read_table(local)
    assert table.num_rows == 7
    keys = zip(table["example_id"].to_pylist(), table["rollout_index"].to_pylist(), strict=True)
    assert sorted(keys) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0)]
    if backend.server is not None:  # the server stored it on S3
        import boto3

        s3 = boto3.client("s3", endpoint_url=backend.server.s3_endpoint)
        objects = s3.list_objects_v2(Bucket=backend.server.bucket)["Contents"]
        s3.close()
        suffix = f"{mlflow_id}/artifacts/rollouts.parquet"
        assert any(o["Key"].startswith("mlflow/") and o["Key"].endswith(suffix) for o in objects)
    else:  # local artifacts under VFOPS_HOME
        assert list((backend.home / "mlflow" / "artifacts").rglob("rollouts.parquet"))

    # idempotent: the recorded run is reused, also when the registry lost the link
    assert log_eval_run(engine, run_id) == mlflow_id
    with session_scope(engine) as session:
        row = get_run(session, run_id)
        assert row is not None
        row.mlflow_run_id = None
    assert log_eval_run(engine, run_id) == mlflow_id
    assert _registry_mlflow_id(engine, run_id) == mlflow_id
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_sweep_cells_nest_under_a_parent_run(backend: Backend, tmp_path: Path) -> None:
    engine = get_engine(f"sqlite:///{tmp_path / 'registry.db'}")
    parents = start_sweep_runs(["arithmetic", "arithmetic"], sweep_name="sweep-1")
    assert list(parents) == ["arithmetic"]
    parent_id = parents["arithmetic"]
    runs = [_registry_run(engine, examples=1, rollouts=1) for _ in range(2)]
    children = [log_eval_run(engine, run_id, parent_run_id=parent_id) for run_id in runs]
    finish_sweep_runs(parents)
    client = mlflow_client()
    for child in children:
        assert client.get_run(child).data.tags["mlflow.parentRunId"] == parents["arithmetic"]
    parent = client.get_run(parents["arithmetic"])
    assert parent.info.status == "FINISHED"
    assert parent.info.experiment_id == client.get_run(children[0]).info.experiment_id


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [VFOPS, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def _all_artifact_bytes(client: Any, run_id: str, folder: Path) -> list[bytes]:
    local = Path(client.download_artifacts(run_id, "", str(folder)))
    return [p.read_bytes() for p in local.rglob("*") if p.is_file()]


def test_vfops_eval_logs_to_mlflow_and_never_logs_secrets(backend: Backend, tmp_path: Path) -> None:
    env = {**os.environ, "MY_FAKE_OPENAI": FAKE_OPENAI_KEY}
    if backend.server is None:  # the fake AWS keys are in the environment either way
        env.update(fake_aws_env("http://127.0.0.1:9"))
    env.pop("OPENAI_API_KEY", None)
    with StubServer(StubConfig(reply_mode="arithmetic", api_key=FAKE_OPENAI_KEY)) as server:
        result = _cli(
            "eval", "arithmetic", "-m", "stub-model", "-b", server.base_url, "-k", "MY_FAKE_OPENAI",
            "-n", "4", "-r", "2", "-q", "-o", str(tmp_path / "out"), env=env,
        )  # fmt: skip
        assert server.stats["ok"] == 8
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr, result.stderr

    engine = get_engine()
    with session_scope(engine, write=False) as session:
        from vfops.registry import RunFilter, list_runs

        (row,) = list_runs(session, RunFilter(env_name="arithmetic"))
        run_id, mlflow_id = row.id, row.mlflow_run_id
    assert mlflow_id is not None
    client = mlflow_client()
    run = client.get_run(mlflow_id)
    assert run.data.tags[RUN_ID_TAG] == run_id
    assert run.data.params["model"] == "stub-model"
    assert run.data.metrics["rollouts"] == 8 and "reward_mean" in run.data.metrics

    # the secrets scan: every param, tag and artifact of every run in MLflow
    texts: list[bytes] = []
    for experiment in client.search_experiments():
        for found in client.search_runs([experiment.experiment_id]):
            texts += [f"{k}={v}".encode() for k, v in found.data.params.items()]
            texts += [f"{k}={v}".encode() for k, v in found.data.tags.items()]
            texts += _all_artifact_bytes(client, found.info.run_id, tmp_path / found.info.run_id)
    assert any(b"rollouts.parquet" in t or len(t) > 1000 for t in texts)
    for secret in SECRETS:
        assert all(secret.encode() not in t for t in texts), secret
    store = backend.home / "mlflow"
    for path in store.rglob("*") if store.exists() else []:
        if path.is_file():
            data = path.read_bytes()
            assert all(secret.encode() not in data for secret in SECRETS), path


def test_unreachable_tracking_server_fails_before_the_eval(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "VFOPS_HOME": str(tmp_path / "home"),
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}",
    }
    with StubServer(StubConfig(reply_mode="arithmetic")) as server:
        result = _cli("eval", "arithmetic", "-m", "stub-model", "-b", server.base_url, "-n", "2",
                      "-r", "1", "-q", "-o", str(tmp_path / "out"), env=env)  # fmt: skip
        assert server.stats["ok"] == 0
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "MLflow tracking server" in lines[0], result.stderr
    assert "--no-tracking" in lines[0]


def test_sweep_flow_nests_every_cell_under_its_parent_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.settings import (
        PREFECT_HOME,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        PREFECT_UI_URL,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    from vfops.flows.eval_sweep import eval_sweep
    from vfops.sweeps import SweepSpec
    from vfops.tracking import SWEEP_TAG

    monkeypatch.setenv("VFOPS_HOME", str(tmp_path / "home"))
    for var in (
        "MLFLOW_TRACKING_URI",
        "VFOPS_MLFLOW_ARTIFACTS",
        "VFOPS_TRACKING",
        "OPENAI_API_KEY",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("VFOPS_DATABASE_URL", f"sqlite:///{tmp_path / 'registry.db'}")
    monkeypatch.setenv("VFOPS_TRACE_ROLLOUTS", "all")  # the suite's default is off (conftest)
    settings: dict[Any, Any] = {
        PREFECT_HOME: str(tmp_path / "prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED: False,
        PREFECT_UI_URL: "http://prefect.example:4200",
    }
    with (
        StubServer(StubConfig(reply_mode="arithmetic")) as stub,
        temporary_settings(updates=settings),
        prefect_test_harness(server_startup_timeout=180),
    ):
        endpoints = tmp_path / "endpoints.toml"
        endpoints.write_text(
            f'[[endpoint]]\nalias = "stub"\nmodel = "stub-model"\nbase_url = "{stub.base_url}"\n'
        )
        spec = SweepSpec.model_validate(
            {
                "environments": ["arithmetic"],
                "endpoints": ["stub"],
                "endpoints_file": str(endpoints),
                "sampling": [{"name": "cold", "args": {"temperature": 0.0}}, {"name": "warm"}],
                "num_examples": 2,
                "rollouts_per_example": 1,
                "output_dir": str(tmp_path / "out"),
            }
        )
        state = eval_sweep(spec=spec, return_state=True)
        assert state.is_completed(), state.message
        results = state.result()
    engine = get_engine()
    client = mlflow_client()
    (experiment,) = [e for e in client.search_experiments() if e.name == "vfops/arithmetic"]
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if SWEEP_TAG in r.data.tags]
    assert parent.info.status == "FINISHED"
    # every MLflow run started from the flow run links back to it
    flow_run_id = parent.data.tags["prefect.flow_run_id"]
    flow_run_url = f"http://prefect.example:4200/flow-runs/flow-run/{flow_run_id}"
    assert all(r.data.tags.get("prefect.flow_run_url") == flow_run_url for r in runs), [
        r.data.tags for r in runs
    ]
    assert len(results) == 2
    for result in results:
        mlflow_id = _registry_mlflow_id(engine, result["run_id"])
        assert mlflow_id is not None
        child = client.get_run(mlflow_id)
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.tags[RUN_ID_TAG] == result["run_id"]
        assert child.data.params["model"] == "stub-model"
    # each cell's rollouts as traces of its run (its flow run ended once they were in)
    for result in results:
        mlflow_id = _registry_mlflow_id(engine, result["run_id"])
        traces = client.search_traces(locations=[experiment.experiment_id], run_id=mlflow_id)
        assert len(traces) == 2, mlflow_id
        assert all(t.info.tags[RUN_ID_TAG] == result["run_id"] for t in traces)
        assert all("reward" in {a.name for a in t.info.assessments} for t in traces)
