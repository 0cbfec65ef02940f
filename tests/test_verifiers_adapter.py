"""Environments written for ``verifiers`` run unchanged through vfops's evaluation path.

The four packages under ``tests/verifiers_envs`` use only ``verifiers``' public API
(single-turn with an XML parser, multi-turn, tools, an EnvGroup) and are installed
from their own folders (``make setup``). Each is evaluated twice against the same
deterministic stub endpoint (``tests/verifiers_stub.py``): by ``verifiers``' own
``Environment.evaluate`` (``tests/verifiers_reference.py``) and by vfops
(``vfops.evaluation.evaluate_async``, the path ``vfops eval``, sweeps, nightly and
promotion all take). Every example must get the same rewards and metrics.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import verifiers as vf

from tests.verifiers_reference import metrics_by_example, rewards_by_example, verifiers_outputs
from tests.verifiers_stub import reply
from vfops._rollout import RolloutRecord
from vfops._tool_counts import TOOL_COUNT_METRICS
from vfops.envs import installed_environments, load_environment
from vfops.evaluation import (
    EvalRequest,
    ModelOptions,
    RunOptions,
    evaluate_async,
    iter_records,
)
from vfops.testing import StubConfig, StubServer

REPO = Path(__file__).resolve().parent.parent
ENVS = {  # environment -> examples evaluated (vf_group: five rows per sub-environment)
    "vf_xml_math": 8,
    "vf_guess": 8,
    "vf_tools": 8,
    "vf_group": 10,
}
R = 2


@pytest.fixture(scope="module")
def stub() -> Any:
    with StubServer(StubConfig(reply_mode=reply)) as server:
        yield server


def vfops_records(env: str, base_url: str, tmp_path: Path, n: int) -> list[RolloutRecord]:
    """vfops's evaluation of ``env``, in this (the main) thread: verifiers installs signal
    handlers when some environments load (EnvGroup), which only the main thread may."""
    request = EvalRequest(
        env_name=env, model="stub-model", base_url=base_url, num_examples=n,
        rollouts_per_example=R, max_concurrent=16,
    )  # fmt: skip
    result = asyncio.run(
        evaluate_async(
            request, RunOptions(output_root=tmp_path, registry=False, tracking=False),
            model_options=ModelOptions(base_url=base_url),
        )
    )  # fmt: skip
    assert result.status == "completed", result.error
    assert result.run_dir is not None
    return sorted(iter_records(result.run_dir), key=lambda r: r.key)


def test_verifiers_packages_are_found_by_name_with_their_library() -> None:
    installed = installed_environments()
    for name in ENVS:
        assert installed[name].library == "verifiers", name
        assert installed[name].version == "0.1.0"
    assert installed["arithmetic"].library == "vfops"
    env = load_environment("vf_xml_math", num_examples=3)
    assert type(env).__name__ == "VerifiersEnvironment"
    assert isinstance(env.vf_env, vf.SingleTurnEnv)  # type: ignore[attr-defined]
    assert env.eval_size() == 3


@pytest.mark.parametrize("env", sorted(ENVS))
def test_same_rewards_and_metrics_per_example_as_verifiers_own_evaluation(
    env: str, stub: Any, tmp_path: Path
) -> None:
    n = ENVS[env]
    reference = verifiers_outputs(env, stub.base_url, num_examples=n, rollouts_per_example=R)
    records = vfops_records(env, stub.base_url, tmp_path, n)
    assert len(records) == n * R
    ours: dict[int, list[float]] = {}
    our_metrics: dict[int, list[dict[str, float]]] = {}
    for record in records:
        assert record.reward is not None, record.error
        ours.setdefault(record.example_id, []).append(record.reward)
        # verifiers' own metrics: vfops's tool counts (TOOL_COUNT_METRICS) are its addition
        theirs_only = {k: v for k, v in record.metrics.items() if k not in TOOL_COUNT_METRICS}
        our_metrics.setdefault(record.example_id, []).append(theirs_only)
    theirs = rewards_by_example(reference)
    assert {k: sorted(v) for k, v in ours.items()} == {k: sorted(v) for k, v in theirs.items()}
    assert len({tuple(v) for v in theirs.values()}) > 1  # the stub's choices differ per row
    canonical = {
        k: sorted(json.dumps(m, sort_keys=True) for m in v) for k, v in our_metrics.items()
    }
    expected = {
        k: sorted(json.dumps(m, sort_keys=True) for m in v)
        for k, v in metrics_by_example(reference).items()
    }
    assert canonical == expected


def test_records_hold_every_message_tool_calls_and_tokens(stub: Any, tmp_path: Path) -> None:
    records = vfops_records("vf_tools", stub.base_url, tmp_path, ENVS["vf_tools"])
    with_tools = [r for r in records if any(m.get("tool_calls") for m in r.completion)]
    assert with_tools
    record = with_tools[0]
    roles = [m["role"] for m in record.completion]
    assert roles[0] == "assistant" and "tool" in roles
    call = next(m for m in record.completion if m.get("tool_calls"))["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] in {"add", "multiply"}
    answer = next(m for m in record.completion if m["role"] == "tool")
    assert (
        answer["tool_call_id"] == call["id"]
        and str(answer["content"]).strip().lstrip("-").isdigit()
    )
    assert record.turns == sum(1 for m in record.completion if m["role"] == "assistant")
    for each in records:  # the calls run (each answered by a tool message), none failed
        answers = sum(1 for m in each.completion if m["role"] == "tool")
        assert (each.metrics["tool_calls"], each.metrics["tool_errors"]) == (answers, 0.0)
    assert sum(r.metrics["tool_calls"] for r in records) > 0
    assert record.usage.prompt_tokens > 0 and record.usage.completion_tokens > 0
    assert record.prompt[0]["role"] == "system"


def test_an_empty_reply_keeps_verifiers_score_and_a_failed_call_is_unscored(
    tmp_path: Path,
) -> None:
    """verifiers scores a rollout that stopped on an empty reply (the model's doing); a
    call that still fails after vfops's retries is an error without a reward."""

    def empty(_: dict[str, Any]) -> dict[str, Any]:
        return {"role": "assistant", "content": ""}

    with StubServer(StubConfig(reply_mode=empty)) as server:
        records = vfops_records("vf_xml_math", server.base_url, tmp_path / "a", 2)
    assert all(r.reward == 0.0 for r in records)
    assert {r.error.type for r in records if r.error} == {"EmptyModelResponseError"}
    with StubServer(StubConfig(reply_mode=reply, rate_500=1.0)) as server:
        request = EvalRequest(
            env_name="vf_xml_math", model="stub-model", base_url=server.base_url,
            num_examples=2, rollouts_per_example=1,
        )  # fmt: skip
        result = asyncio.run(
            evaluate_async(
                request, RunOptions(output_root=tmp_path / "b", registry=False, tracking=False),
                model_options=ModelOptions(base_url=server.base_url, max_retries=1),
            )
        )  # fmt: skip
        assert result.run_dir is not None
        failed = list(iter_records(result.run_dir))
        requests = server.stats["requests"]
    assert [r.reward for r in failed] == [None, None]
    assert all(r.error and r.error.stage == "generation" for r in failed)
    assert all(r.error and "500" in r.error.message for r in failed), failed[0].error
    assert requests == 4  # each call retried once by vfops's client, then given up


def test_vfops_eval_of_a_verifiers_package_records_its_provenance(
    stub: Any, tmp_path: Path
) -> None:
    database = f"sqlite:///{tmp_path / 'registry.db'}"
    env = {
        **os.environ, "VFOPS_HOME": str(tmp_path / "home"), "VFOPS_DATABASE_URL": database,
        "VFOPS_TRACE_ROLLOUTS": "all",
    }  # fmt: skip
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("VFOPS_TRACKING", None)
    command = [
        sys.executable, "-m", "vfops", "eval", "vf_guess", "-m", "stub-model",
        "-b", stub.base_url, "-n", "4", "-r", "2", "-o", str(tmp_path / "out"),
        "--wait-for-tracking",
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Map:" not in done.stderr  # no stray datasets progress bar
    (metadata_path,) = (tmp_path / "out").rglob("metadata.json")
    metadata = json.loads(metadata_path.read_text())
    assert metadata["env_version"].startswith("local+")
    assert metadata["env_library"] == f"verifiers=={vf.__version__}"
    assert metadata["summary"]["rollouts"] == 8
    from vfops.registry import get_engine, get_run, session_scope

    engine = get_engine(database)
    with session_scope(engine) as session:
        run = get_run(session, metadata["run_id"])
        assert run is not None
        assert run.status == "completed"
        assert f"verifiers=={vf.__version__}" in run.tags
        assert run.environment_version == metadata["env_version"]
        mlflow_run_id = run.mlflow_run_id
    # its MLflow run (the embedded store), with verifiers' metrics and a trace per rollout
    assert mlflow_run_id
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'home' / 'mlflow' / 'mlflow.db'}")
    logged = client.get_run(mlflow_run_id)
    assert logged.data.metrics["reward_mean"] == pytest.approx(metadata["summary"]["reward_mean"])
    assert "speed_bonus" in " ".join(logged.data.metrics)
    assert logged.data.tags["vfops.environment_version"] == metadata["env_version"]
    traces = client.search_traces(locations=[logged.info.experiment_id], max_results=50)
    assert len(traces) == 8


def test_a_verifiers_run_stopped_mid_way_resumes_to_exactly_n_x_r(tmp_path: Path) -> None:
    """SIGTERM mid-run through an endpoint alias (endpoints.toml): the run is interrupted
    with its rows kept; --resume asks the endpoint only for what is missing and ends
    with exactly N x R rollouts whose rewards are verifiers' own."""
    import signal
    import time

    database = f"sqlite:///{tmp_path / 'registry.db'}"
    env = {
        **os.environ, "VFOPS_HOME": str(tmp_path / "home"), "VFOPS_TRACKING": "0",
        "VFOPS_DATABASE_URL": database,
    }  # fmt: skip
    n = 8
    with StubServer(StubConfig(reply_mode=reply, latency_ms=150)) as server:
        endpoints = tmp_path / "endpoints.toml"
        endpoints.write_text(
            f'[[endpoint]]\nalias = "stub"\nmodel = "stub-model"\nbase_url = "{server.base_url}"\n'
        )
        args = [
            sys.executable, "-m", "vfops", "eval", "vf_guess", "-m", "stub", "-e", str(endpoints),
            "-n", str(n), "-r", str(R), "-c", "2", "-o", str(tmp_path / "out"),
        ]  # fmt: skip
        process = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 240  # a safety net: a group on disk is the signal's cue
        results: list[Path] = []
        while not (results and len(results[0].read_bytes().splitlines()) >= 2):
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                pytest.fail(f"no group on disk: {process.communicate()[1].decode()[-2000:]}")
            time.sleep(0.05)
            results = list((tmp_path / "out").rglob("results.jsonl"))
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 143, stderr.decode()
        (results_file,) = results
        done_before = len(results_file.read_bytes().splitlines())
        assert 0 < done_before < n * R
        metadata = json.loads((results_file.parent / "metadata.json").read_text())
        assert metadata["status"] == "interrupted"
        asked = server.stats["requests"]
        resumed = subprocess.run(
            [*args, "--resume", metadata["run_id"]], env=env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        new_requests = server.stats["requests"] - asked
        reference = verifiers_outputs("vf_guess", server.base_url, num_examples=n,
                                      rollouts_per_example=R)  # fmt: skip
    records = list(iter_records(results_file.parent))
    assert sorted(r.key for r in records) == [(i, j) for i in range(n) for j in range(R)]
    ours: dict[int, list[float]] = {}
    for record in records:
        ours.setdefault(record.example_id, []).append(float(record.reward or 0.0))
    theirs = rewards_by_example(reference)
    assert {k: sorted(v) for k, v in ours.items()} == {k: sorted(v) for k, v in theirs.items()}
    # only the missing rollouts were generated again (each a few turns)
    turns_missing = sum(r.turns for r in records) - sum(
        json.loads(line)["turns"] for line in results_file.read_bytes().splitlines()[:done_before]
    )
    assert new_requests <= turns_missing + 2 * 6  # + rollouts in flight at the SIGTERM
    assert json.loads((results_file.parent / "metadata.json").read_text())["status"] == "completed"


def test_publish_and_install_a_verifiers_package_then_eval_records_the_version(
    stub: Any, tmp_path: Path
) -> None:
    """``vfops env publish`` of a verifiers package (no vfops entry point: its module is
    the environment), ``env install NAME@VER`` into a fresh virtualenv, and an eval there
    recorded as that published version."""
    import shutil

    source = REPO / "tests" / "verifiers_envs" / "vf_xml_math"
    package = tmp_path / "vf_pub_math"
    package.mkdir()
    module = (source / "vf_xml_math.py").read_text()
    (package / "vf_pub_math.py").write_text(module)
    (package / "pyproject.toml").write_text(
        (source / "pyproject.toml")
        .read_text()
        .replace("vf-xml-math", "vf-pub-math")
        .replace("vf_xml_math", "vf_pub_math")
    )
    assert not list(package.glob("*.egg-info"))
    database = f"sqlite:///{tmp_path / 'registry.db'}"
    env = {
        **os.environ, "VFOPS_HOME": str(tmp_path / "home"), "VFOPS_TRACKING": "0",
        "VFOPS_DATABASE_URL": database, "VFOPS_ARTIFACTS": (tmp_path / "store").as_uri(),
    }  # fmt: skip

    def vfops(*args: str, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [python, "-m", "vfops", *args], env=env, capture_output=True, text=True, timeout=300
        )

    published = vfops("env", "publish", str(package))
    assert published.returncode == 0, published.stderr
    assert "published vf_pub_math@0.1.0" in published.stdout
    assert "eval: 20 rows" in published.stdout  # verifiers' formatted split, snapshotted
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    main_site = next(p for p in sys.path if p.endswith("site-packages"))
    (site / "vfops_main.pth").write_text(f"import site; site.addsitedir({main_site!r})\n")
    python = str(venv / "bin" / "python")
    shutil.rmtree(package)  # what runs next is the published wheel, not the folder
    installed = vfops("env", "install", "vf_pub_math@0.1.0", "--no-deps", python=python)
    assert installed.returncode == 0, installed.stderr
    listed = vfops("env", "list", python=python)
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in listed.stdout.splitlines()]
    assert ["vf_pub_math", "verifiers", "0.1.0", "1", "0.1.0"] in rows, listed.stdout
    evaluated = vfops(
        "eval", "vf_pub_math", "-m", "stub-model", "-b", stub.base_url, "-n", "4", "-r", "2",
        "-o", str(tmp_path / "out"), "--max-error-rate", "0.6", python=python,
    )  # fmt: skip
    # examples 1 and 3 get empty replies: verifiers' EmptyModelResponseError, scored 0.0
    assert evaluated.returncode == 0, evaluated.stderr
    (metadata_path,) = (tmp_path / "out").rglob("metadata.json")
    metadata = json.loads(metadata_path.read_text())
    assert metadata["env_version"] == "0.1.0"
    assert metadata["env_library"] == f"verifiers=={vf.__version__}"
    assert metadata["summary"]["reward_mean"] == pytest.approx((1.2 + 0.0 + 0.04 + 0.0) / 4)


def test_finding_verifiers_packages_imports_no_verifiers() -> None:
    """`vfops env list`, `vfops eval` of a vfops environment and the adapter package itself
    stay free of verifiers' import (seconds: it imports the Anthropic and OpenAI SDK types)."""
    code = (
        "import sys, vfops, vfops.adapters\n"
        "from vfops.envs import find_environment, installed_environments, load_environment\n"
        "assert installed_environments()['vf_guess'].library == 'verifiers'\n"
        "assert find_environment('vf-tools').name == 'vf_tools'\n"
        "load_environment('arithmetic')\n"
        "heavy = sorted(m for m in ('verifiers', 'anthropic') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_verifiers_environment_builds_in_a_worker_thread() -> None:
    """Prefect runs tasks (sweep and nightly cells) in worker threads, where verifiers'
    own signal.signal calls would raise; the process's handlers stay as they were."""
    import signal
    import threading

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    built: list[Any] = []
    failed: list[BaseException] = []

    def build() -> None:
        try:
            built.append(load_environment("vf_xml_math", num_examples=2))
        except BaseException as exc:
            failed.append(exc)

    worker = threading.Thread(target=build)
    worker.start()
    worker.join()
    assert not failed, failed
    assert built[0].eval_size() == 2
    load_environment("vf_guess")  # and on the main thread
    assert {sig: signal.getsignal(sig) for sig in before} == before
