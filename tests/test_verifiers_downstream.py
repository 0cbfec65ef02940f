"""A ``verifiers`` environment downstream of evaluation: a sweep cell and a promotion gate.

Issue 15's bar: "A verifiers environment runs as a cell of an eval-sweep flow and as
a promotion gate". Everything here is the project's real path, as the tests of vfops
environments take it:

- the ``eval-sweep`` Prefect flow (``vfops/flows/eval_sweep.py``) under the Prefect test
  harness, and :func:`vfops.sweeps.run_cell_async` on SQLite and PostgreSQL, run the
  installed test packages ``vf_xml_math`` and ``vf_guess`` (tests/verifiers_envs)
  against the stub server answering with ``tests/verifiers_stub.reply``, whose
  per-example rewards are known; MLflow tracking is on (the default), as in
  tests/test_flow_eval_sweep.py;
- promotion (:func:`vfops.models.promote` and ``vfops promote``) evaluates registered
  model versions *in-process* (``models:/NAME/VERSION`` loaded by
  :class:`vfops.local.LocalModelClient`; it takes no endpoint), so its candidates are
  tiny checkpoints, as in tests/test_models_registry.py, on the embedded MLflow stores
  and on a real ``mlflow server`` with S3 artifacts on moto. The gate environments are
  ``verifiers`` packages: the installed ``vf_xml_math`` and ``vf_brevity_gate``, a
  tiny package written with ``verifiers``' public API only (``vf.SingleTurnEnv``,
  ``vf.Rubric``; found by vfops as any installed distribution requiring
  ``verifiers``) whose rubric rewards brevity, so that a checkpoint capped at fewer
  tokens is deterministically better (greedy decoding: a prefix of the same reply).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# before Prefect is imported: no telemetry, no ~/.prefect
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="vfops-prefect-home-"))

import pytest
import verifiers as vf
from sqlalchemy import text
from typer.testing import CliRunner

from tests.env_fixtures import published_and_installed
from tests.mlflow_fixtures import MlflowServer, fake_aws_env
from tests.model_fixtures import checkpoint
from tests.prefect_fixtures import flow_run_artifacts
from tests.registry_fixtures import DIALECTS, database_url, stored_count, stored_rollouts
from tests.verifiers_stub import reply
from vfops.registry import (
    EvalRunRow,
    dispose_engines,
    get_engine,
    get_run,
    session_scope,
)
from vfops.sweeps import SweepSpec
from vfops.testing import StubConfig, StubServer

# MLflow's SQLAlchemy store still uses the ``noload`` strategy (deprecated in SQLAlchemy 2.1)
pytestmark = [
    pytest.mark.tracking,  # what these tests check is in MLflow (tests/conftest.py)
    pytest.mark.filterwarnings(
        "ignore:The ``noload`` loader strategy is deprecated:DeprecationWarning"
    ),
]

N, R = 8, 2
VERIFIERS_TAG = f"verifiers=={vf.__version__}"

# Per-example rewards of the stub (tests/verifiers_stub.py), every rollout alike.
# vf_xml_math: correct 1.2, empty reply 0.0 (an EmptyModelResponseError, verifiers'
# score kept), plain text 0.04, wrong 0.2, <answer> without <think> 1.12.
XML_MATH_REWARDS = {0: 1.2, 1: 0.0, 2: 0.04, 3: 0.0, 4: 0.04, 5: 0.2, 6: 0.2, 7: 1.12}
XML_MATH_EMPTY = {1, 3}
# vf_guess (max_turns 6): solved 1.0 + speed bonus 0.2 * (6 - turns) / 5; 0.0 unsolved.
GUESS_REWARDS = {0: 1.0, 1: 1.16, 2: 1.08, 3: 1.16, 4: 0.0, 5: 0.0, 6: 1.16, 7: 0.0}
KNOWN = {"vf_xml_math": XML_MATH_REWARDS, "vf_guess": GUESS_REWARDS}


def registry_run(url: str, run_id: str) -> EvalRunRow:
    with session_scope(get_engine(url), write=False) as session:
        run = get_run(session, run_id, exact=True)
        assert run is not None, run_id
        session.expunge(run)
        return run


def rewards_by_example(url: str, run_id: str) -> dict[int, list[float | None]]:
    out: dict[int, list[float | None]] = {}
    for record in stored_rollouts(get_engine(url), run_id):
        out.setdefault(record.example_id, []).append(record.reward)
    return out


def error_types_by_example(url: str, run_id: str) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for record in stored_rollouts(get_engine(url), run_id):
        if record.error is not None:
            out.setdefault(record.example_id, set()).add(record.error.type)
    return out


def assert_known_rewards(url: str, env: str, run_id: str) -> None:
    got = rewards_by_example(url, run_id)
    assert sorted(got) == list(range(N)), got
    for example, rewards in got.items():
        assert rewards == [pytest.approx(KNOWN[env][example])] * R, (env, example, rewards)
    errors = error_types_by_example(url, run_id)
    if env == "vf_xml_math":  # the empty replies, each with verifiers' score (0.0)
        assert errors == {e: {"EmptyModelResponseError"} for e in XML_MATH_EMPTY}
    else:
        assert errors == {}


def assert_mlflow_run_names(registry_id: str, mlflow_id: str | None) -> None:
    from vfops.tracking import RUN_ID_TAG, mlflow_client

    assert mlflow_id, f"registry run {registry_id} has no MLflow run"
    assert mlflow_client().get_run(mlflow_id).data.tags[RUN_ID_TAG] == registry_id


@pytest.fixture(scope="module")
def vf_stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(reply_mode=reply)) as server:
        yield server


# --- 1. a sweep cell ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def sweep_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """As tests/test_flow_eval_sweep.py: SQLite in a temp folder (both dialects are
    covered by the run_cell test below)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('registry') / 'registry.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VFOPS_DATABASE_URL", url)
        patch.setenv("VFOPS_ARTIFACTS", tmp_path_factory.mktemp("artifacts").as_uri())
        patch.delenv("OPENAI_API_KEY", raising=False)
        yield url
    dispose_engines()


def write_endpoints(path: Path, base_url: str) -> Path:
    path.write_text(
        f'[[endpoint]]\nalias = "stub"\nmodel = "stub-model"\nbase_url = "{base_url}"\n'
    )
    return path


def test_verifiers_environments_are_cells_of_an_eval_sweep_flow(
    harness: None, sweep_registry: str, vf_stub: StubServer, tmp_path: Path
) -> None:
    from vfops.flows.eval_sweep import REPORT_KEY, TABLE_KEY, eval_sweep
    from vfops.tracking import mlflow_client

    url = sweep_registry
    spec = SweepSpec.model_validate(
        {
            "environments": ["vf_xml_math", "vf_guess"],
            "endpoints": ["stub"],
            "endpoints_file": str(write_endpoints(tmp_path / "endpoints.toml", vf_stub.base_url)),
            "sampling": [
                {"name": "cold", "args": {"temperature": 0.0}},
                {"name": "warm", "args": {"temperature": 0.7}},
            ],
            "num_examples": N,
            "rollouts_per_example": R,
            "max_concurrent": 8,
            "output_dir": str(tmp_path / "out"),
        }
    )
    state = eval_sweep(spec=spec, return_state=True)
    assert state.is_completed(), state.message
    results = state.result()
    assert len(results) == 2 * 1 * 2
    assert {(r["env"], r["sampling"]) for r in results} == {
        (env, s) for env in ("vf_xml_math", "vf_guess") for s in ("cold", "warm")
    }
    engine = get_engine(url)
    versions: dict[str, str] = {}
    for result in results:
        env = result["env"]
        assert result["action"] == "created" and result["status"] == "completed", result
        assert result["rollouts"] == N * R == stored_count(engine, result["run_id"])
        assert result["version"].startswith("local+") and not result["published"]
        assert result["errors"] == (len(XML_MATH_EMPTY) * R if env == "vf_xml_math" else 0)
        run = registry_run(url, result["run_id"])
        assert run.environment_name == env and run.status == "completed"
        assert (run.num_examples, run.rollouts_per_example) == (N, R)
        assert run.environment_version == result["version"]
        assert VERIFIERS_TAG in run.tags
        assert run.sampling_args == (
            {"temperature": 0.0} if result["sampling"] == "cold" else {"temperature": 0.7}
        )
        assert_known_rewards(url, env, result["run_id"])
        # tracked like any cell: an MLflow run naming the registry run, under the
        # sweep's parent run of that environment
        assert result["mlflow_run_id"] == run.mlflow_run_id
        assert_mlflow_run_names(run.id, run.mlflow_run_id)
        parent = mlflow_client().get_run(run.mlflow_run_id).data.tags["mlflow.parentRunId"]
        assert mlflow_client().get_run(parent).data.tags["vfops.environment"] == env
        versions.setdefault(env, result["version"])
        assert versions[env] == result["version"]  # one code hash per environment
    assert len({r["run_id"] for r in results}) == 4
    json.dumps(results)

    artifacts = asyncio.run(flow_run_artifacts(state.state_details.flow_run_id))
    assert set(artifacts) == {TABLE_KEY, REPORT_KEY}
    table = artifacts[TABLE_KEY].data
    rows = json.loads(table) if isinstance(table, str) else table
    assert len(rows) == 4
    assert {(row["environment"], row["version"], row["model"]) for row in rows} == {
        (env, version, "stub") for env, version in versions.items()
    }
    assert all(" ± " in row["reward"] and row["rollouts"] == N * R for row in rows)
    empty = len(XML_MATH_EMPTY) * R
    assert sorted(row["errors"] for row in rows) == [0, 0, empty, empty]
    report = artifacts[REPORT_KEY].data
    assert isinstance(report, str)
    for result in results:
        assert f"run `{result['run_id']}`" in report
        assert f"{result['env']}\\@{result['version']}" in report
    assert vf_stub.base_url not in table and vf_stub.base_url not in report

    # the same sweep again: every cell reuses its run, no model call, no new run
    before = vf_stub.stats["requests"]
    again = eval_sweep(spec=spec, return_state=True)
    assert again.is_completed(), again.message
    assert {r["action"] for r in again.result()} == {"reused"}
    assert {r["run_id"] for r in again.result()} == {r["run_id"] for r in results}
    assert vf_stub.stats["requests"] == before
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM eval_runs")).scalar_one() == 4


@pytest.fixture(params=DIALECTS)
def db_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    for url in database_url(request.param, tmp_path):
        monkeypatch.setenv("VFOPS_DATABASE_URL", url)
        yield url


async def test_a_verifiers_cell_runs_and_is_reused_on_both_dialects(
    db_url: str, vf_stub: StubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """:func:`vfops.sweeps.run_cell_async` (the body of the flow's task), as
    tests/test_sweeps.py runs it on SQLite and PostgreSQL."""
    from vfops.sweeps import run_cell_async, sweep_table, validate_sweep

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    endpoints = write_endpoints(tmp_path / "endpoints.toml", vf_stub.base_url)
    spec = SweepSpec(
        environments=["vf_xml_math"], endpoints=["stub"], endpoints_file=str(endpoints),
        num_examples=N, rollouts_per_example=R, max_concurrent=8,
    )  # fmt: skip
    (cell,) = validate_sweep(spec)
    before = vf_stub.stats["requests"]
    first = await run_cell_async(cell, output_root=tmp_path / "out")
    assert first.action == "created" and first.status == "completed"
    assert (
        first.rollouts
        == first.new_rollouts
        == N * R
        == stored_count(get_engine(db_url), first.run_id)
    )
    assert first.version.startswith("local+") and not first.published
    assert first.errors == len(XML_MATH_EMPTY) * R
    assert first.reward_mean == pytest.approx(sum(XML_MATH_REWARDS.values()) / N)
    assert vf_stub.stats["requests"] - before == N * R  # single-turn: one call a rollout
    run = registry_run(db_url, first.run_id)
    assert (run.environment_name, run.status) == ("vf_xml_math", "completed")
    assert run.environment_version == first.version and VERIFIERS_TAG in run.tags
    assert_known_rewards(db_url, "vf_xml_math", first.run_id)
    assert_mlflow_run_names(run.id, first.mlflow_run_id)

    requests = vf_stub.stats["requests"]
    second = await run_cell_async(cell, output_root=tmp_path / "out")
    assert second.action == "reused" and second.run_id == first.run_id
    assert second.new_rollouts == 0 and second.rollouts == N * R
    assert vf_stub.stats["requests"] == requests
    (row,) = sweep_table([first])
    assert (row["environment"], row["version"], row["model"]) == (
        "vf_xml_math",
        first.version,
        "stub",
    )


# --- 2. a promotion gate -----------------------------------------------------------------

BREVITY_ENV = "vf_brevity_gate"
GATE_ENVS = [BREVITY_ENV, "vf_xml_math"]
GATE_N, GATE_R = 6, 2
SAMPLING = {"temperature": 0.0}


@pytest.fixture(scope="module")
def brevity_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ``verifiers`` environment package (a module and its dist-info on sys.path): no
    vfops entry point, a requirement on ``verifiers``, ``verifiers``' API only."""
    site = tmp_path_factory.mktemp("vf_gate_site")
    (site / f"{BREVITY_ENV}.py").write_text(
        textwrap.dedent(
            """
            import verifiers as vf
            from datasets import Dataset


            def load_environment(num_examples: int = 12) -> vf.Environment:
                def brevity(completion, **_) -> float:
                    text = completion[-1]["content"] if completion else ""
                    return 1.0 / (1.0 + len(text or ""))

                rows = [
                    {"question": f"Tell me about item {i}.", "answer": ""}
                    for i in range(num_examples)
                ]
                return vf.SingleTurnEnv(
                    eval_dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[brevity])
                )
            """
        )
    )
    dist = site / f"{BREVITY_ENV}-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vf-brevity-gate\nVersion: 0.0.1\n"
        "Requires-Dist: verifiers>=0.3.1,<0.4\nRequires-Dist: datasets\n"
    )
    (dist / "top_level.txt").write_text(f"{BREVITY_ENV}\n")
    sys.path.insert(0, str(site))
    import importlib

    importlib.invalidate_caches()
    yield BREVITY_ENV
    sys.path.remove(str(site))
    sys.modules.pop(BREVITY_ENV, None)


@pytest.fixture(params=["embedded", "server"])
def mlflow_backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """As tests/test_models_registry.py: the embedded MLflow stores (SQLite, local
    artifacts), or a real mlflow server with S3 artifacts on moto; a SQLite registry."""
    monkeypatch.setenv("VFOPS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    monkeypatch.setenv("VFOPS_DATABASE_URL", url)
    monkeypatch.setenv("USER", "tester")
    s3_endpoint = "http://127.0.0.1:9"  # the fake AWS secrets are set either way
    if request.param == "server":
        server: MlflowServer = request.getfixturevalue("mlflow_server")
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
        s3_endpoint = server.s3_endpoint
    for key, value in fake_aws_env(s3_endpoint).items():
        monkeypatch.setenv(key, value)
    yield url
    dispose_engines()


def test_verifiers_environments_gate_a_promotion(
    tiny_base: Path, brevity_env: str, mlflow_backend: str, tmp_path: Path
) -> None:
    from vfops.cli._app import app as vfops_app
    from vfops.envs import find_environment
    from vfops.models import (
        PromotionRefusedError,
        PromotionRequest,
        promote,
        promotion_history,
        register_checkpoint,
    )
    from vfops.tracking import mlflow_client

    url = mlflow_backend
    for env in GATE_ENVS:  # both are verifiers packages to vfops
        entry = find_environment(env)
        assert entry is not None and entry.library == "verifiers", env
    gate: dict[str, Any] = {
        "gate_envs": GATE_ENVS, "num_examples": GATE_N, "rollouts_per_example": GATE_R,
        "sampling_args": SAMPLING,
    }  # fmt: skip

    # v1: no holder yet, promoted on its evaluation
    v1 = register_checkpoint(checkpoint(tiny_base, tmp_path / "v1", 8), name="tiny")
    first = promote(PromotionRequest("tiny", v1.version, **gate))
    assert first.promoted and first.from_version is None, first.reason
    assert [r.env for r in first.envs] == GATE_ENVS
    assert all(r.candidate_errors == 0 and not r.candidate_reused for r in first.envs)

    # v2 (longer replies) through `vfops promote`: refused, naming the verifiers env
    v2 = register_checkpoint(checkpoint(tiny_base, tmp_path / "v2", 32), name="tiny")
    command = [
        "promote", "tiny", v2.version, "-e", GATE_ENVS[0], "-e", GATE_ENVS[1],
        "-n", str(GATE_N), "-r", str(GATE_R), "-S", json.dumps(SAMPLING),
    ]  # fmt: skip
    refused = CliRunner().invoke(vfops_app, command, env={"COLUMNS": "200"})
    assert refused.exit_code == 1, refused.output
    assert isinstance(refused.exception, PromotionRefusedError), refused.output
    decision = refused.exception.decision
    assert decision.outcome == "refused" and decision.from_version == "1"
    assert f"{BREVITY_ENV} regressed" in decision.reason and "delta -" in decision.reason
    assert "vf_xml_math regressed" not in decision.reason
    assert f"refused: refused tiny v{v2.version} -> @champion" in refused.output
    brevity, xml_math = decision.envs
    assert brevity.env == BREVITY_ENV and brevity.regressed and brevity.verdict == "regression"
    assert brevity.delta is not None and brevity.delta < 0
    assert not xml_math.regressed
    # the holder's runs answer this exact gate: reused, not evaluated again
    assert all(r.holder_reused for r in decision.envs)
    assert [r.holder_run_id for r in decision.envs] == [r.candidate_run_id for r in first.envs]

    # v3 (shorter replies): the gate passes and the alias moves
    v3 = register_checkpoint(checkpoint(tiny_base, tmp_path / "v3", 2), name="tiny")
    third = promote(PromotionRequest("tiny", v3.version, **gate))
    assert third.promoted and third.from_version == "1", third.reason
    brevity, xml_math = third.envs
    assert brevity.verdict == "improvement" and brevity.delta is not None and brevity.delta > 0
    assert not xml_math.regressed
    assert str(mlflow_client().get_model_version_by_alias("tiny", "champion").version) == v3.version

    history = promotion_history("tiny")
    assert [(e.from_version, e.to_version, e.outcome) for e in history] == [
        (None, "1", "promoted"),
        ("1", "2", "refused"),
        ("1", "3", "promoted"),
    ]
    assert all(set(e.evidence["envs"]) == set(GATE_ENVS) for e in history)

    # every gate evaluation is a registry run of a verifiers env, with its MLflow run
    evidence_runs = {
        info[key]
        for e in history
        for info in e.evidence["envs"].values()
        for key in ("candidate_run_id", "holder_run_id")
        if info[key]
    }
    with get_engine(url).connect() as connection:
        ids = list(connection.execute(text("SELECT id FROM eval_runs")).scalars())
    assert len(ids) == 3 * len(GATE_ENVS) and set(ids) == evidence_runs  # each version once
    models: dict[str, set[str]] = {env: set() for env in GATE_ENVS}
    for run_id in ids:
        run = registry_run(url, run_id)
        assert run.environment_name in GATE_ENVS and run.status == "completed"
        assert run.environment_version.startswith("local+")
        assert VERIFIERS_TAG in run.tags and "promotion" in run.tags
        assert (run.num_examples, run.rollouts_per_example) == (GATE_N, GATE_R)
        assert run.sampling_args == SAMPLING
        assert (run.summary or {}).get("errors", 0) == 0
        assert stored_count(get_engine(url), run_id) == GATE_N * GATE_R
        models[run.environment_name].add(run.model)
        assert_mlflow_run_names(run_id, run.mlflow_run_id)
        if run.environment_name == BREVITY_ENV:  # verifiers' rubric wrote each reward
            for record in stored_rollouts(get_engine(url), run_id):
                reply_text = record.completion[-1]["content"] or ""
                assert record.reward == pytest.approx(1.0 / (1.0 + len(reply_text)))
                assert record.metrics["brevity"] == pytest.approx(record.reward)
    assert models == {env: {f"models:/tiny/{v}" for v in ("1", "2", "3")} for env in GATE_ENVS}


@pytest.fixture(scope="module")
def published_vf_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A verifiers package (a renamed copy of vf_xml_math) published, then installed from
    the registry into a folder on sys.path: what ``nightly-eval`` evaluates at @latest."""
    root = tmp_path_factory.mktemp("vf-nightly")
    source = Path(__file__).resolve().parent / "verifiers_envs" / "vf_xml_math"
    package = root / "src" / "vf_night_math"
    package.mkdir(parents=True)
    (package / "vf_night_math.py").write_text((source / "vf_xml_math.py").read_text())
    (package / "pyproject.toml").write_text(
        (source / "pyproject.toml")
        .read_text()
        .replace("vf-xml-math", "vf-night-math")
        .replace("vf_xml_math", "vf_night_math")
    )
    with published_and_installed(root, package, "vf_night_math"):
        yield str(root)
    dispose_engines()


# Prefect's events client (emit_event) leaves its websocket sockets to the garbage
# collector, as in tests/test_flow_nightly.py: that is Prefect's, not ours.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_verifiers_environment_is_a_nightly_cell(
    harness: None, published_vf_env: str, vf_stub: StubServer
) -> None:
    """Two nights of ``nightly-eval`` on a published verifiers package: each night's cell is
    a completed registry run of the published version (tagged with the verifiers
    version), with verifiers' per-example rewards, and the second night is compared with
    the first (same rewards: no regression)."""
    from vfops.flows.nightly import NightlyConfig, nightly_eval

    endpoints = write_endpoints(Path(published_vf_env) / "endpoints.toml", vf_stub.base_url)
    url = f"sqlite:///{Path(published_vf_env) / 'registry.db'}"
    nights = []
    for night in ("2026-12-01", "2026-12-02"):
        config = NightlyConfig(
            environments=["vf_night_math"], endpoints=["stub"], endpoints_file=str(endpoints),
            num_examples=8, rollouts_per_example=2, date=night,
        )  # fmt: skip
        nights.append(await nightly_eval(config))
    first, second = (comparisons[0] for comparisons in nights)
    for comparison in (first, second):
        run = registry_run(url, comparison["run_id"])
        assert run.status == "completed" and run.environment_version == "0.1.0"
        assert run.environment_version_id is not None  # the published row
        assert f"verifiers=={vf.__version__}" in run.tags and "nightly" in run.tags
        rewards = rewards_by_example(url, run.id)
        expected = [1.2, 0.0, 0.04, 0.0, 0.04, 0.2, 0.2, 1.12]  # the stub's pinned rows
        assert sorted(rewards) == list(range(8))
        for example, value in enumerate(expected):
            assert rewards[example] == pytest.approx([value, value])
    assert first["previous_run_id"] is None
    assert second["previous_run_id"] == first["run_id"]
    assert second["regressed"] is False
