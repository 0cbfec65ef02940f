"""MLflow pages that show what the registry knows (issue 45, finding 6).

An eval run's MLflow run has the environment's dataset as an input (a published
version: its snapshot's digest and place in the artifact store; otherwise the digest of
the rows it evaluated, with a source naming the environment) and, for a registered
model version, that version as a tag and its logged model as a model input; a promoted
version carries tags naming its gate's evidence runs and deltas. All on real embedded
stores (MLflow's SQLite store, the SQLite registry, a local artifact store).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.env_fixtures import published_and_installed
from tests.model_fixtures import checkpoint
from vfops.registry import dispose_engines
from vfops.testing import StubConfig, StubServer

pytestmark = [
    pytest.mark.tracking,  # what these tests check is in MLflow (tests/conftest.py)
    # MLflow's SQLAlchemy store still uses the ``noload`` strategy (deprecated in 2.1)
    pytest.mark.filterwarnings(
        "ignore:The ``noload`` loader strategy is deprecated:DeprecationWarning"
    ),
]

ENV = "mlf_links_env"


@pytest.fixture(scope="module")
def published_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A published environment (SQLite registry, local artifact store under ``root``),
    installed from the registry into a folder on sys.path."""
    from vfops.cli._env import init_environment

    root = tmp_path_factory.mktemp("links")
    package = init_environment(ENV, root / "src")
    with published_and_installed(root, package, ENV):
        yield root
    dispose_engines()


def _eval(root: Path, stub: StubServer, **request: Any) -> Any:
    from vfops.evaluation import EvalRequest, ModelOptions, RunOptions, evaluate

    result = evaluate(
        EvalRequest(env_name=ENV, model="stub-model", num_examples=4, rollouts_per_example=2,
                    **request),
        RunOptions(output_root=root / "out", tracking=True),
        model_options=ModelOptions(base_url=stub.base_url),
    )  # fmt: skip
    assert result.status == "completed", result.error
    return result


def _mlflow_run(run_id: str) -> Any:
    from sqlalchemy import text

    from vfops.registry import get_engine
    from vfops.tracking import mlflow_client

    with get_engine().connect() as connection:
        mlflow_id = connection.execute(
            text("SELECT mlflow_run_id FROM eval_runs WHERE id = :id"), {"id": run_id}
        ).scalar_one()
    assert mlflow_id, f"run {run_id} has no MLflow run"
    return mlflow_client().get_run(mlflow_id)


def _eval_dataset(run: Any) -> tuple[Any, dict[str, str]]:
    (found,) = run.inputs.dataset_inputs
    return found.dataset, {tag.key: tag.value for tag in found.tags}


def test_an_eval_of_a_published_environment_has_its_snapshot_as_dataset_input(
    published_env: Path,
) -> None:
    """The MLflow run's dataset is the published version's eval snapshot: its sha256
    (cut to MLflow's 36 characters, whole in the profile) and its file in the artifact
    store; with environment arguments (other rows than the snapshot's), the digest of
    the rows it evaluated and a source naming the environment and its arguments."""
    from vfops.registry import find_version, get_engine, session_scope

    with session_scope(get_engine(), write=False) as session:
        row = find_version(session, ENV)
        assert row is not None
        published_version, snapshot = row.version, dict(row.datasets["eval"])
    assert snapshot["uri"].startswith((published_env / "artifacts").as_uri())

    with StubServer(StubConfig(reply_mode="arithmetic")) as stub:
        published = _eval(published_env, stub)
        with_args = _eval(published_env, stub, env_args={"seed": 7})

    dataset, tags = _eval_dataset(_mlflow_run(published.run_id))
    assert tags == {"mlflow.data.context": "eval"}
    assert dataset.name == f"{ENV}@{published_version}/eval"
    assert dataset.digest == snapshot["sha256"][:36]
    assert dataset.source_type == "local"
    assert json.loads(dataset.source) == {"uri": snapshot["uri"]}
    assert json.loads(dataset.profile) == {
        "sha256": snapshot["sha256"], "rows": snapshot["rows"], "split": "eval"
    }  # fmt: skip

    dataset, tags = _eval_dataset(_mlflow_run(with_args.run_id))
    assert tags == {"mlflow.data.context": "eval"}
    assert dataset.source_type == "code"
    source = json.loads(dataset.source)["tags"]
    assert source["vfops.environment"] == ENV
    assert source["vfops.environment_version"] == published_version
    assert json.loads(source["vfops.env_args"]) == {"seed": 7}
    profile = json.loads(dataset.profile)
    assert profile["rows"] == 4 and dataset.digest == profile["sha256"][:36]
    assert dataset.digest != snapshot["sha256"][:36]


def _stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFOPS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("VFOPS_DATABASE_URL", f"sqlite:///{tmp_path / 'registry.db'}")
    monkeypatch.setenv("USER", "tester")


@pytest.fixture
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Embedded MLflow (SQLite + local artifacts) and a SQLite vfops registry."""
    _stores(tmp_path, monkeypatch)
    yield
    dispose_engines()


def test_gate_evals_link_their_model_version_and_the_champion_names_its_evidence(
    tiny_base: Path, gate_env: str, stores: None, tmp_path: Path
) -> None:
    """Promoting v1 (no holder) then v2 (better, over v1): each gate eval's MLflow run
    has its version as a tag and its logged model as a model input, and the rows of the
    unpublished gate environment as its dataset; v2, promoted, carries the gate's
    evidence: the MLflow runs of its and v1's gate evals, the delta, its CI, the verdict."""
    from vfops.models import PromotionRequest, promote, register_checkpoint
    from vfops.models._evidence_tags import PROMOTION_TAG_PREFIX as P
    from vfops.tracking import LOGGED_MODEL_TAG, MODEL_VERSION_TAG, mlflow_client

    gate = {
        "gate_envs": [gate_env],
        "num_examples": 6,
        "rollouts_per_example": 1,
        "sampling_args": {"temperature": 0.0},
    }
    v1 = register_checkpoint(checkpoint(tiny_base, tmp_path / "v1", 8), name="tiny")
    v2 = register_checkpoint(checkpoint(tiny_base, tmp_path / "v2", 2), name="tiny")
    first = promote(PromotionRequest("tiny", v1.version, **gate))
    second = promote(PromotionRequest("tiny", v2.version, **gate))
    assert first.promoted and second.promoted, second.reason
    (result,) = second.envs
    assert result.holder_run_id == first.envs[0].candidate_run_id  # v1's run, reused
    assert result.delta is not None and result.delta > 0

    client = mlflow_client()
    runs = {}
    for version, run_id in ((v1, result.holder_run_id), (v2, result.candidate_run_id)):
        assert run_id is not None
        run = runs[version.version] = _mlflow_run(run_id)
        assert run.data.tags[MODEL_VERSION_TAG] == f"models:/tiny/{version.version}"
        logged = version.tags[LOGGED_MODEL_TAG]
        assert [m.model_id for m in run.inputs.model_inputs] == [logged]
        model = client.get_logged_model(logged)
        assert model.source_run_id == version.run_id and model.status == "READY"
        assert json.loads(model.tags["mlflow.modelVersions"]) == [
            {"name": "tiny", "version": int(version.version)}
        ]
        dataset, tags = _eval_dataset(run)
        assert tags == {"mlflow.data.context": "eval"} and dataset.source_type == "code"
        assert json.loads(dataset.source)["tags"]["vfops.environment"] == gate_env
        assert json.loads(dataset.profile)["rows"] == 6
    # both versions evaluated the same rows: one dataset, one digest
    assert len({_eval_dataset(run)[0].digest for run in runs.values()}) == 1

    tags = client.get_model_version("tiny", v2.version).tags
    env = f"{P}{gate_env}."
    assert tags[f"{P}alias"] == "champion" and tags[f"{P}decision"] == "promoted"
    assert tags[f"{P}replaced"] == "v1" and tags[f"{P}metric"] == "reward_mean"
    assert tags[f"{P}event_id"] == str(second.event_id)
    assert tags[f"{env}candidate_run"] == runs[v2.version].info.run_id
    assert tags[f"{env}holder_run"] == runs[v1.version].info.run_id
    assert tags[f"{env}candidate_registry_run"] == result.candidate_run_id
    assert tags[f"{env}holder_registry_run"] == result.holder_run_id
    assert float(tags[f"{env}delta"]) == pytest.approx(result.delta, abs=1e-6)
    low, high = (float(x) for x in tags[f"{env}ci"].strip("[]").split(","))
    assert (low, high) == pytest.approx((result.ci_low, result.ci_high), abs=1e-6)
    assert tags[f"{env}verdict"] == result.verdict
    # v1's own promotion (no holder): its evidence is its own run; no delta to name
    first_tags = client.get_model_version("tiny", v1.version).tags
    assert first_tags[f"{env}candidate_run"] == runs[v1.version].info.run_id
    assert f"{env}delta" not in first_tags and first_tags[f"{P}replaced"] == "no holder"
