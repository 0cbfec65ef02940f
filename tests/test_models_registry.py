"""Checkpoints in the MLflow registry and evidence-gated promotion.

The promotion scenario runs on the embedded stores (SQLite, local artifacts) and
against a real ``mlflow server`` whose artifacts go to S3 on moto's server mode.

The gate environment rewards brevity: 1 / (1 + characters of the reply). The
tiny model decodes greedily (temperature 0), so a checkpoint whose
``generation_config.json`` caps replies at fewer tokens is deterministically
better: the same weights, a prefix of the same reply. Promotion evaluates the
registered artifacts themselves (downloaded from MLflow, loaded in-process).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from tests.mlflow_fixtures import MlflowServer, fake_aws_env
from tests.model_fixtures import checkpoint
from vfops.registry import dispose_engines, get_engine

# MLflow's SQLAlchemy store still uses the ``noload`` strategy (deprecated in SQLAlchemy 2.1)
pytestmark = [
    pytest.mark.tracking,  # what these tests check is in MLflow (tests/conftest.py)
    pytest.mark.filterwarnings(
        "ignore:The ``noload`` loader strategy is deprecated:DeprecationWarning"
    ),
]

SAMPLING = {"temperature": 0.0}


def _stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    home = tmp_path / "home"
    monkeypatch.setenv("VFOPS_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    monkeypatch.setenv("VFOPS_DATABASE_URL", url)
    monkeypatch.setenv("USER", "tester")
    return url


@pytest.fixture
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Embedded MLflow (SQLite + local artifacts) and a SQLite vfops registry."""
    yield _stores(tmp_path, monkeypatch)
    dispose_engines()


@pytest.fixture(params=["embedded", "server"])
def mlflow_backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[MlflowServer | None]:
    """The embedded stores, or a real mlflow server with S3 artifacts on moto."""
    _stores(tmp_path, monkeypatch)
    server: MlflowServer | None = None
    s3_endpoint = "http://127.0.0.1:9"  # the fake AWS secrets are set either way
    if request.param == "server":
        server = request.getfixturevalue("mlflow_server")
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
        s3_endpoint = server.s3_endpoint
    for key, value in fake_aws_env(s3_endpoint).items():
        monkeypatch.setenv(key, value)
    yield server
    dispose_engines()


def test_register_then_load_round_trips_the_folder(tiny_base: Path, stores: str) -> None:
    from vfops.models import load_model_dir, register_checkpoint
    from vfops.tracking import tracking_uri

    info = register_checkpoint(
        tiny_base,
        name="tiny",
        training_run_id="train-123",
        base_model="tiny-base",
        environment_versions=["brevity_gate@0.0.1"],
    )
    assert tracking_uri().endswith("/home/mlflow/mlflow.db")
    assert info.version == "1"
    assert info.tags["vfops.training_run_id"] == "train-123"
    assert info.tags["vfops.base_model"] == "tiny-base"
    assert json.loads(info.tags["vfops.environment_versions"]) == {"brevity_gate": "0.0.1"}
    assert info.source.startswith((Path(stores[10:]).parent / "home" / "mlflow").as_uri())
    local = load_model_dir("models:/tiny/1")
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        assert (local / name).read_bytes() == (tiny_base / name).read_bytes()


def _bucket_keys(server: MlflowServer) -> list[str]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=server.s3_endpoint)
    try:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=server.bucket)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]
    finally:
        s3.close()


def test_promotion_gate_records_every_decision(
    tiny_base: Path,
    gate_env: str,
    mlflow_backend: MlflowServer | None,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from vfops.cli._promote import promote_command
    from vfops.local import LocalModelClient
    from vfops.models import (
        PromotionRefusedError,
        PromotionRequest,
        load_model_dir,
        promote,
        promotion_history,
        register_checkpoint,
    )

    gate = {
        "gate_envs": [gate_env],
        "num_examples": 10,
        "rollouts_per_example": 2,
        "sampling_args": SAMPLING,
    }
    v1 = register_checkpoint(checkpoint(tiny_base, tmp_path / "v1", 8), name="tiny")
    capfd.readouterr()
    first = promote(PromotionRequest("tiny", v1.version, **gate))
    assert first.promoted and first.from_version is None and not first.forced
    # the gate downloaded v1 to evaluate it, without MLflow's progress bars
    assert "Downloading artifacts" not in capfd.readouterr().err

    v2 = register_checkpoint(checkpoint(tiny_base, tmp_path / "v2", 32), name="tiny")
    second = promote(PromotionRequest("tiny", v2.version, **gate))
    assert second.outcome == "refused"
    assert second.from_version == "1"
    assert f"{gate_env} regressed" in second.reason and "delta -" in second.reason
    (result,) = second.envs
    assert result.regressed and result.delta is not None and result.delta < 0
    with pytest.raises(PromotionRefusedError, match=gate_env):
        second.raise_if_refused()

    # the holder v1 already has a completed run answering this exact gate: reused
    assert result.holder_run_id == first.envs[0].candidate_run_id and result.holder_reused

    v3 = register_checkpoint(checkpoint(tiny_base, tmp_path / "v3", 2), name="tiny")
    # existing evidence for the candidate: a plain `vfops eval -m models:/tiny/3` run
    from vfops.cli._app import app as vfops_app

    evaluated = CliRunner().invoke(
        vfops_app,
        [
            "eval",
            gate_env,
            "-m",
            "models:/tiny/3",
            "-n",
            "10",
            "-r",
            "2",
            "-T",
            "0",
            "-o",
            str(tmp_path / "outputs"),
            "--quiet",
            "--wait-for-tracking",  # its MLflow link is checked below
        ],
        env={"COLUMNS": "200"},
    )
    assert evaluated.exit_code == 0, evaluated.output
    with get_engine().connect() as connection:
        (evidence_run,) = connection.execute(
            text("SELECT id FROM eval_runs WHERE model = 'models:/tiny/3'")
        ).scalars()
    from vfops._errors import VfopsError

    with pytest.raises(VfopsError, match="evaluated models:/tiny/2, not models:/tiny/3"):
        promote(  # a run of another version is not evidence for v3
            PromotionRequest(
                "tiny", v3.version, evidence_runs={gate_env: result.candidate_run_id}, **gate
            )
        )
    evidence = {gate_env: evidence_run}
    third = promote(PromotionRequest("tiny", v3.version, evidence_runs=evidence, **gate))
    assert third.promoted, third.reason
    (result,) = third.envs
    assert result.candidate_run_id == evidence_run and result.candidate_reused
    assert result.delta is not None and result.delta > 0 and result.verdict == "improvement"

    history = promotion_history("tiny")
    assert [(e.from_version, e.to_version, e.outcome) for e in history] == [
        (None, "1", "promoted"),
        ("1", "2", "refused"),
        ("1", "3", "promoted"),
    ]
    assert all(e.actor == "tester" and not e.forced and e.alias == "champion" for e in history)
    # the evidence names real registry runs of the gate environment
    engine = get_engine()
    run_ids = {
        run
        for e in history
        for info in e.evidence["envs"].values()
        for run in (info["candidate_run_id"], info["holder_run_id"])
        if run
    }
    assert len(run_ids) == 3  # v1, v2, v3: each evaluated once, reused after
    # the gate evaluates in-process models: nothing priced, so no cost (never $0)
    assert all(e.evidence["cost_usd"] is None for e in history)
    with engine.connect() as connection:
        envs = connection.execute(text("SELECT DISTINCT environment_name FROM eval_runs")).scalars()
        assert list(envs) == [gate_env]
        links = connection.execute(text("SELECT id, mlflow_run_id FROM eval_runs")).all()
    # every gate evaluation went through the one evaluation path: each is an MLflow run
    # that names its registry run
    from vfops.tracking import RUN_ID_TAG, mlflow_client

    assert len(links) == 3 and all(mlflow_id for _, mlflow_id in links)
    tracking = mlflow_client()
    for run_id, mlflow_id in links:
        assert tracking.get_run(mlflow_id).data.tags[RUN_ID_TAG] == run_id

    champion = load_model_dir("models:/tiny@champion")
    assert json.loads((champion / "generation_config.json").read_text())["max_new_tokens"] == 2
    assert champion == load_model_dir("models:/tiny/3")
    LocalModelClient(champion)  # loads

    # CLI: the history, and a forced promotion of the worse v2 (recorded as forced)
    app_runner = CliRunner()
    import typer

    app = typer.Typer()
    app.command()(promote_command)
    shown = app_runner.invoke(app, ["history", "tiny"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert shown.output.count("promoted") == 2 and shown.output.count("refused") == 1
    forced = promote(PromotionRequest("tiny", "2", force=True, **gate))
    assert forced.promoted and forced.forced and "FORCED" in forced.reason
    assert promotion_history("tiny")[-1].forced
    assert load_model_dir("models:/tiny@champion").name == "2"

    if mlflow_backend is not None:  # the checkpoints went to S3 through the server
        keys = _bucket_keys(mlflow_backend)
        assert sum(key.endswith("/model/model.safetensors") for key in keys) == 3, keys

    # no S3 secret in any model version's tags or its registering run's params and tags
    from tests.s3_fixtures import FAKE_SECRET_ACCESS_KEY, FAKE_SESSION_TOKEN
    from vfops.tracking import mlflow_client

    client = mlflow_client()
    texts = []
    for mv in client.search_model_versions("name='tiny'"):
        texts.append(repr(mv.tags) + repr(mv.description) + mv.source)
        run = client.get_run(mv.run_id)
        texts.append(repr(run.data.params) + repr(run.data.tags))
    assert len(texts) == 6
    for secret in (FAKE_SECRET_ACCESS_KEY, FAKE_SESSION_TOKEN):
        assert all(secret not in t for t in texts)


def test_promote_checkpoint_flow_is_defined() -> None:
    from vfops.flows.promote import promote_checkpoint_flow

    assert promote_checkpoint_flow.name == "promote-checkpoint"


def test_a_gate_run_with_errored_rollouts_decides_nothing(
    tiny_base: Path, gate_env: str, stores: str, tmp_path: Path
) -> None:
    """Errored rollouts count as 0.0 in the comparison: a crashed scorer on the
    holder's run would promote any candidate. Such a gate refuses, naming the run."""
    from vfops.models import PromotionRequest, promote, promotion_history, register_checkpoint

    gate: dict[str, Any] = {
        "gate_envs": [gate_env], "num_examples": 6, "rollouts_per_example": 1,
        "sampling_args": SAMPLING,
    }  # fmt: skip
    v1 = register_checkpoint(checkpoint(tiny_base, tmp_path / "v1", 8), name="errs")
    broken = {"env_args": {gate_env: {"fail_on": "item 3."}}}
    refused = promote(PromotionRequest("errs", v1.version, **gate, **broken))
    assert refused.outcome == "refused"
    (result,) = refused.envs
    assert result.inconclusive and result.candidate_errors == 1
    assert f"{gate_env} inconclusive: run {result.candidate_run_id} of v1 has 1 errored" in (
        refused.reason
    )
    assert "vfops runs show RUN --failed" in refused.reason
    # the errored run is not reused as evidence later; a clean gate decides
    promoted = promote(PromotionRequest("errs", v1.version, **gate))
    assert promoted.promoted and promoted.envs[0].candidate_errors == 0
    v2 = register_checkpoint(checkpoint(tiny_base, tmp_path / "v2", 2), name="errs")
    again = promote(PromotionRequest("errs", v2.version, **gate, **broken))
    assert again.outcome == "refused" and again.envs[0].holder_errors == 1
    assert [e.outcome for e in promotion_history("errs")] == ["refused", "promoted", "refused"]
    forced = promote(PromotionRequest("errs", v2.version, **gate, **broken, force=True))
    assert forced.promoted and forced.forced and "inconclusive" in forced.reason
