"""``vfops`` end to end: real processes, real HTTP to a stub server on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

import vfops
from tests.request_gate import RequestGate
from vfops.evaluation import load_results
from vfops.testing import StubConfig, StubServer

VFOPS = str(Path(sys.executable).parent / "vfops")
SOURCE_ROOT = str(Path(vfops.__file__).resolve().parents[1])
"""The checkout whose vfops these tests import: the CLI subprocesses run it too
(an editable install may point at another checkout)."""


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(reply_mode="echo_answer")) as server:
        yield server


def run_cli(
    *args: str,
    site: Path | None = None,
    extra_env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    path = [str(site)] if site else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, SOURCE_ROOT]), **(extra_env or {})}
    env.pop("OPENAI_API_KEY", None)
    return subprocess.run(
        [VFOPS, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def records(run_root: Path) -> list[dict[str, object]]:
    (results,) = run_root.glob("evals/*/*/results.jsonl")
    return [orjson.loads(line) for line in results.read_bytes().splitlines()]


@pytest.mark.tracking  # a newcomer's first eval, with the defaults: it is in MLflow too
def test_env_init_install_and_eval_against_a_server(tmp_path: Path) -> None:
    created = run_cli("env", "init", "demo_env", "--path", str(tmp_path / "environments"))
    assert created.returncode == 0, created.stderr
    package = tmp_path / "environments" / "demo_env"
    assert {p.name for p in package.rglob("*") if p.is_file()} == {
        "pyproject.toml",
        "demo_env.py",
        "README.md",
        "test_demo_env.py",
    }
    site = tmp_path / "site"
    installed = run_cli("env", "install", str(package), "--target", str(site), "--no-deps")
    assert installed.returncode == 0, installed.stderr
    with StubServer(StubConfig(reply_mode="arithmetic")) as server:
        result = run_cli(
            "eval",
            "demo_env",
            "--model",
            "stub-model",
            "--base-url",
            server.base_url,
            "-n",
            "50",
            "-r",
            "2",
            "-o",
            str(tmp_path / "out"),
            "--wait-for-tracking",
            site=site,
        )
        assert server.stats["ok"] == 100
    assert result.returncode == 0, result.stderr
    assert "reward" in result.stdout and "pass@2" in result.stdout
    rows = records(tmp_path / "out")
    assert len(rows) == 100
    assert all(row["metrics"]["correct_answer"] == 1.0 for row in rows)  # type: ignore[index]
    (metadata_path,) = (tmp_path / "out").glob("evals/*/*/metadata.json")
    metadata = orjson.loads(metadata_path.read_bytes())
    # never published: recorded as local code with its hash, not as the package's 0.1.0
    assert metadata["env_version"] == f"local+{metadata['env_code_hash'][:12]}"
    assert metadata["status"] == "completed" and len(metadata["run_id"]) == 32
    assert len(load_results(metadata_path.parent)) == 100  # the Arrow export, memory-mapped
    # the same run, logged to MLflow by the tracker process (waited for), linked both ways
    assert metadata["mlflow_run_id"] and f"mlflow run: {metadata['mlflow_run_id']}" in result.stdout


def test_env_init_writes_tests_that_pass(tmp_path: Path) -> None:
    from vfops.cli._env import init_environment

    package = init_environment("fresh_env", tmp_path)
    paths = [str(package), os.environ.get("PYTHONPATH", "")]
    options = ["-q", "-p", "no:cacheprovider", "-W", "error", "-o", "asyncio_mode=auto"]
    options += ["-o", "asyncio_default_fixture_loop_scope=function"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *options, str(package / "tests")],
        capture_output=True,
        text=True,
        cwd=package,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        timeout=120,
        check=False,
    )
    assert result.returncode == 0 and "2 passed" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("retries", ["default", "none"])
def test_eval_completes_against_a_faulty_endpoint(
    env_site: Path, tmp_path: Path, retries: str
) -> None:
    """A burst of 429s at the start (about 8 for each of the first 32 rollouts), then
    30 % 429 (all with Retry-After), 10 % 500 and 2 % timeouts: with the default
    retries every rollout is scored; with --max-retries 0 the 5xx and timeouts are
    recorded as errors (the 429s are still waited out: they are not failures)."""
    config = StubConfig(
        reply_mode="echo_answer",
        fail_first_n=256,
        fail_first_kind="429",
        rate_429=0.3,
        retry_after_s=0.05,
        rate_500=0.1,
        rate_timeout=0.02,
        latency_ms=5,
        seed=7,
    )
    flags = [] if retries == "default" else ["--max-retries", "0"]
    with StubServer(config) as server:
        result = run_cli(
            "eval", "echo_env", "-m", "stub-model", "-b", server.base_url,
            "-n", "100", "-r", "2", "-c", "32", "--request-timeout", "1", *flags,
            "-o", str(tmp_path),
            site=env_site,
        )  # fmt: skip
        stats = server.stats
    assert stats["429"] > 256 + 30 and stats["500"] > 5 and stats["timeout"] > 0
    rows = records(tmp_path)
    assert len({(r["example_id"], r["rollout_index"]) for r in rows}) == len(rows) == 200
    # every rollout ends scored or with its error recorded, and the summary counts both
    assert all((r["reward"] is None) != (r["error"] is None) for r in rows)
    (metadata_path,) = tmp_path.glob("evals/*/*/metadata.json")
    summary = orjson.loads(metadata_path.read_bytes())["summary"]
    assert summary["scored"] + summary["errors"] == 200
    assert summary["scored"] == sum(r["reward"] is not None for r in rows)
    errors = [r["error"] for r in rows if r["error"] is not None]
    if retries == "default":
        assert result.returncode == 0, result.stderr
        assert errors == []
    else:
        assert len(errors) > 5
        kinds = {e["type"] for e in errors}  # type: ignore[index]
        assert kinds <= {"InternalServerError", "APITimeoutError"}, kinds
        assert "InternalServerError" in kinds
        # a script can tell: completed with errors exits 3 and says how many, in one line
        assert result.returncode == 3, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"error: completed with errors: {len(errors)} of 200 rollouts")
        assert "generation:InternalServerError" in line and "--max-error-rate" in line


@pytest.mark.parametrize(
    ("failing", "flags", "code"),
    [
        ("none", [], 0),
        ("some", [], 3),  # the default tolerates no error
        ("some", ["--max-error-rate", "0.5"], 0),  # 2 of 8 errored: within 50 %
        ("some", ["--max-error-rate", "0.2"], 3),
        ("all", ["--max-error-rate", "1"], 3),  # every rollout failed: never a success
    ],
)
def test_exit_status_says_whether_rollouts_errored(
    failing: str, flags: list[str], code: int, env_site: Path, tmp_path: Path
) -> None:
    config = {
        "none": StubConfig(reply_mode="echo_answer"),
        # the first 2 chat requests fail (retries off): 2 of 8 rollouts errored
        "some": StubConfig(reply_mode="echo_answer", fail_first_n=2),
        "all": StubConfig(reply_mode="echo_answer", rate_500=1.0),
    }[failing]
    with StubServer(config) as server:
        result = run_cli(
            "eval", "echo_env", "-m", "stub-model", "-b", server.base_url, "-n", "8", "-r", "1",
            "-c", "1", "--max-retries", "0", *flags, "-o", str(tmp_path), site=env_site,
        )  # fmt: skip
    assert result.returncode == code, result.stderr
    errored = sum(r["error"] is not None for r in records(tmp_path))
    assert errored == {"none": 0, "some": 2, "all": 8}[failing]
    if code == 3:
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"error: completed with errors: {errored} of 8 rollouts errored")
    (metadata_path,) = tmp_path.glob("evals/*/*/metadata.json")
    assert orjson.loads(metadata_path.read_bytes())["status"] == "completed"


@pytest.mark.parametrize("rate", ["-0.1", "1.5", "nan"])
def test_max_error_rate_outside_0_to_1_is_refused_in_one_line(
    rate: str, env_site: Path, stub: StubServer, tmp_path: Path
) -> None:
    result = run_cli(
        "eval", "echo_env", "-m", "stub-model", "-b", stub.base_url, "--max-error-rate", rate,
        "-o", str(tmp_path), site=env_site,
    )  # fmt: skip
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: --max-error-rate must be between 0 and 1")
    assert not tmp_path.joinpath("evals").exists()


def test_eval_of_a_model_the_endpoint_does_not_serve(env_site: Path, tmp_path: Path) -> None:
    """Where the endpoint lists its models, a wrong name is one line before any run;
    where it does not, the rollouts and the summary keep the server's explanation."""
    with StubServer(StubConfig(model_name="stub-model", reject_unknown_model=True)) as server:
        checked = run_cli(
            "eval", "echo_env", "-m", "stub-modle", "-b", server.base_url, "-n", "4",
            "-o", str(tmp_path / "checked"), site=env_site,
        )  # fmt: skip
        unchecked = run_cli(
            "eval", "echo_env", "-m", "stub-modle", "-b", server.base_url, "-n", "4", "-r", "2",
            "--no-check-model", "-o", str(tmp_path / "unchecked"), site=env_site,
        )  # fmt: skip
        chat_requests = server.stats["requests"]
    assert checked.returncode != 0
    assert checked.stderr.strip().count("\n") == 0, checked.stderr
    assert "model 'stub-modle' is not served at" in checked.stderr
    assert "it serves stub-model;" in checked.stderr
    assert not (tmp_path / "checked").exists()  # nothing half-written
    assert chat_requests == 8  # the unchecked run's rollouts alone

    explanation = "The model `stub-modle` does not exist or you do not have access to it."
    rows = records(tmp_path / "unchecked")
    assert len(rows) == 8
    assert {r["error"]["type"] for r in rows} == {"NotFoundError"}  # type: ignore[index]
    assert all(explanation in r["error"]["message"] for r in rows)  # type: ignore[index]
    assert f"generation:NotFoundError: HTTP 404 Not Found: {explanation}" in unchecked.stdout
    (metadata_path,) = (tmp_path / "unchecked").glob("evals/*/*/metadata.json")
    summary = orjson.loads(metadata_path.read_bytes())["summary"]
    assert explanation in summary["error_examples"]["generation:NotFoundError"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "no_such_env", "-m", "m"], "unknown environment 'no_such_env' (installed: "),
        # the endpoint is checked first (it serves stub-model): what the environment
        # refuses is found once it loads
        (["eval", "no_prompt_env", "-m", "stub-model"], "neither a 'prompt' nor a 'question'"),
        (["eval", "echo_env", "-m", "m", "-S", "{bad"], "--sampling-args is not valid JSON"),
        (["eval", "echo_env", "-m", "m", "-a", "[1]"], "--env-args must be a JSON object"),
        (
            ["eval", "raising_env", "-m", "stub-model", "-a", '{"size": 2}'],
            "load_environment of 'raising_env' raised ValueError: size must be at least 10, got 2",
        ),
        (["eval", "echo_env", "-m", "m", "-n", "0"], "--num-examples must be positive"),
        (["eval", "echo_env", "-m", "big", "-e", "{endpoints}"], "unknown model alias 'big'"),
        (
            ["eval", "echo_env", "-m", "m", "-k", "VFOPS_TEST_UNSET_KEY"],
            "environment variable VFOPS_TEST_UNSET_KEY is not set",
        ),
        (["eval", "echo_env", "-m", "m", "-b", "http://127.0.0.1:9/v1"], "cannot reach base URL"),
        (
            ["eval", "raising_env", "-m", "other", "-a", '{"size": 2}'],
            "model 'other' is not served",
        ),
    ],
)
def test_bad_input_is_one_line_and_non_zero(
    args: list[str], message: str, env_site: Path, stub: StubServer, tmp_path: Path
) -> None:
    endpoints = tmp_path / "endpoints.toml"
    endpoints.write_text(
        '[[endpoint]]\nalias = "small"\nmodel = "stub-model"\n'
        f'base_url = "{stub.base_url}"\napi_key_var = "OPENAI_API_KEY"\n'
    )
    args = [a.replace("{endpoints}", str(endpoints)) for a in args]
    if "-b" not in args and "-e" not in args:
        args += ["-b", stub.base_url]
    result = run_cli(*args, "-o", str(tmp_path / "out"), site=env_site)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    assert not list((tmp_path / "out").glob("evals/*/*/results.jsonl"))


def test_ctrl_c_keeps_completed_rollouts_and_resume_finishes(
    env_site: Path, tmp_path: Path
) -> None:
    # 200 rollouts, 4 at a time; the stub answers 40 model calls, then holds the rest
    # until the signal has landed: the run stands still mid-run, however busy the machine
    with StubServer(StubConfig(reply_mode="echo_answer", latency_ms=20)) as server:
        args = [
            "eval",
            "echo_env",
            "-m",
            "stub-model",
            "-b",
            server.base_url,
            "-n",
            "100",
            "-r",
            "2",
            "-c",
            "4",
            "-o",
            str(tmp_path),
        ]
        env = {**os.environ, "PYTHONPATH": str(env_site)}
        with RequestGate(server, allow=40):
            process = subprocess.Popen(
                [VFOPS, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            )
            deadline = time.monotonic() + 240  # a safety net: the gate makes the state come
            while len(_lines(tmp_path)) < 10:
                if time.monotonic() > deadline or process.poll() is not None:
                    process.kill()
                    pytest.fail(f"no 10 rollouts on disk: {process.communicate()[1]}")
                time.sleep(0.05)
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=120)
        assert process.returncode == 130, stderr
        assert "interrupted" in stderr and "--resume" in stderr
        kept = records(tmp_path)
        assert 0 < len(kept) < 200
        (run_dir,) = tmp_path.glob("evals/*/*")
        resumed = run_cli(*args, "--resume", str(run_dir), site=env_site)
        assert resumed.returncode == 0, resumed.stderr
    rows = records(tmp_path)
    keys = [(r["example_id"], r["rollout_index"]) for r in rows]
    assert len(keys) == len(set(keys)) == 200
    assert [r["trace_id"] for r in rows[: len(kept)]] == [r["trace_id"] for r in kept]


def _lines(root: Path) -> list[str]:
    found = list(root.glob("evals/*/*/results.jsonl"))
    return found[0].read_text().splitlines() if found else []


def test_api_key_is_used_but_never_written(env_site: Path, tmp_path: Path) -> None:
    secret = "sk-test-a1b2c3-never-store-me"
    with StubServer(StubConfig(reply_mode="echo_answer", api_key=secret)) as server:
        result = run_cli(
            "eval",
            "echo_env",
            "-m",
            "stub-model",
            "-b",
            server.base_url,
            "-k",
            "MY_TEST_KEY",
            "-n",
            "5",
            "-r",
            "1",
            "-o",
            str(tmp_path),
            site=env_site,
            extra_env={"MY_TEST_KEY": secret},
        )
        assert server.stats["ok"] == 5
    assert result.returncode == 0, result.stderr
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert secret not in result.stdout + result.stderr
