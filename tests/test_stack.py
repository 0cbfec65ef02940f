"""``vfops stack``: the production topology as local processes, end to end.

Real processes only: the machine's PostgreSQL, moto's S3 server, an MLflow tracking
server (PostgreSQL + S3 artifacts), a Prefect server (PostgreSQL) and Prefect process
workers, all started by ``vfops stack up`` (one stack for the module: it takes a while
to start). The tests run in file order on that stack: services answer, the ``env``
lines carry an ``vfops eval`` into the stack's registry, MLflow and S3, a killed
worker goes offline and a new one joins, and ``down`` leaves no process. A stack whose
Prefect server gets a wrong database fails ``up`` in one line.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from vfops.testing import StubConfig, StubServer

ADMIN_URL = os.environ.get(
    "VFOPS_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
HEARTBEAT_S = 5  # worker heartbeats: offline after 3 missed, so a killed worker shows in ~20 s


def vfops(
    *args: str, env: dict[str, str] | None = None, timeout: float = 420
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vfops", *args],
        capture_output=True,
        text=True,
        env=env or dict(os.environ),
        timeout=timeout,
        check=False,
    )


def stack_args(stack: dict[str, Any]) -> list[str]:
    return ["--dir", str(stack["dir"])]


def processes_of(stack_id: str, service: str | None = None) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            env = process.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if env.get("VFOPS_STACK_ID") == stack_id and service in (
            None,
            env.get("VFOPS_STACK_SERVICE"),
        ):
            found.append(process)
    return found


def databases(prefix: str) -> set[str]:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as connection:
        rows = connection.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", (f"{prefix}%",)
        ).fetchall()
    return {str(row[0]) for row in rows}


def drop_databases(prefix: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(ADMIN_URL, autocommit=True) as connection:
        for name in databases(prefix):
            connection.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        url,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            status, payload = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, payload = exc.code, exc.read()
        exc.close()
    try:
        return status, json.loads(payload) if payload else None
    except ValueError:
        return status, payload


def pool_workers(stack: dict[str, Any]) -> dict[str, str]:
    state = read_state(stack)
    api = state["services"]["prefect"]["url"]
    status, workers = http("POST", f"{api}/work_pools/{state['pool']}/workers/filter", {})
    assert status == 200, workers
    return {w["name"]: w["status"] for w in workers}


def read_state(stack: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads((stack["dir"] / "stack.json").read_text()))


def env_from_lines(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        word, assignment = shlex.split(line)
        assert word == "export"
        name, _, value = assignment.partition("=")
        found[name] = value
    return found


def require_postgres() -> None:
    import psycopg

    try:
        psycopg.connect(ADMIN_URL, connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL is not reachable at {ADMIN_URL}: {exc}")


def cleanup(directory: Path, name: str, stack_id: str | None) -> None:
    """What down --purge should have done, in case a failing test left it undone."""
    vfops("stack", "down", "--dir", str(directory), "--purge", timeout=120)
    if stack_id:
        for process in processes_of(stack_id):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
    drop_databases(f"{name}_")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_postgres()
    root = tmp_path_factory.mktemp("stack")
    name = f"vfops_stack_t{uuid.uuid4().hex[:8]}"
    directory = root / "stack"
    stack_id = None
    try:
        begun = time.monotonic()
        up = vfops(
            "stack", "up", "--dir", str(directory), "--workers", "2", "--name", name,
            "--worker-heartbeat", str(HEARTBEAT_S), "--postgres-url", ADMIN_URL,
        )  # fmt: skip
        seconds = time.monotonic() - begun
        print(f"\nvfops stack up --workers 2: {seconds:.1f} s")
        assert up.returncode == 0, up.stderr + up.stdout
        stack_id = json.loads((directory / "stack.json").read_text())["stack_id"]
        yield {"dir": directory, "name": name, "root": root, "up": up, "stack_id": stack_id}
    finally:
        cleanup(directory, name, stack_id)


def test_up_starts_every_service_and_says_so_when_running(stack: dict[str, Any]) -> None:
    state = read_state(stack)
    services = state["services"]
    assert set(services) == {"s3", "mlflow", "prefect", "worker-1", "worker-2"}
    assert databases(f"{stack['name']}_") == {
        f"{stack['name']}_registry",
        f"{stack['name']}_prefect",
        f"{stack['name']}_mlflow",
    }
    # every service answers on its loopback port
    assert http("GET", f"{services['s3']['url']}/")[0] == 200  # moto: ListBuckets
    assert http("GET", f"{services['mlflow']['url']}/health")[0] == 200
    assert http("GET", f"{services['prefect']['url']}/health")[0] == 200
    assert pool_workers(stack) == {"worker-1": "ONLINE", "worker-2": "ONLINE"}
    # each worker runs with its name and flow-run heartbeats, and detached
    for worker in ("worker-1", "worker-2"):
        (main,) = [
            p for p in processes_of(stack["stack_id"], worker) if p.pid == services[worker]["pid"]
        ]
        env = main.environ()
        assert env["VFOPS_WORKER_NAME"] == worker
        assert env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30"
        assert os.getsid(main.pid) == main.pid  # a session of its own
    status = vfops("stack", "status", *stack_args(stack))
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.count("  ok ") == 5, status.stdout
    again = vfops("stack", "up", *stack_args(stack), "--workers", "2")
    assert again.returncode == 0, again.stderr
    assert "is already running" in again.stdout and "; started" not in again.stdout
    assert read_state(stack)["services"] == services  # nothing restarted
    # no secret in the state file or any log (the S3 keys travel in env only)
    secret = "vfops-stack-test-secret"
    assert secret not in (stack["dir"] / "stack.json").read_text()
    for log in (stack["dir"] / "logs").glob("*.log"):
        assert secret not in log.read_text(errors="replace"), log


def test_env_lines_point_an_eval_at_the_stack(stack: dict[str, Any], tmp_path: Path) -> None:
    import boto3
    import psycopg

    printed = vfops("stack", "env", *stack_args(stack))
    assert printed.returncode == 0, printed.stderr
    stack_env = env_from_lines(printed.stdout)
    assert set(stack_env) >= {
        "VFOPS_DATABASE_URL", "VFOPS_ARTIFACTS", "VFOPS_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_URI", "MLFLOW_S3_ENDPOINT_URL", "PREFECT_API_URL",
    }  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_"))}
    env.update(stack_env)
    with StubServer(StubConfig(reply_mode="arithmetic")) as stub:
        evaluated = vfops(
            "eval", "arithmetic", "-m", "stub-model", "-b", stub.base_url, "-n", "3", "-r", "2",
            "-o", str(tmp_path / "out"), "--wait-for-tracking", env=env,
        )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    # the run is in the stack's registry database
    registry = stack_env["VFOPS_DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
    assert registry.endswith(f"/{stack['name']}_registry")
    with psycopg.connect(registry) as connection:
        run_id, mlflow_run_id, status = connection.execute(
            "SELECT id, mlflow_run_id, status FROM eval_runs"
        ).fetchone() or (None, None, None)
        (rollouts,) = connection.execute("SELECT count(*) FROM rollouts").fetchone() or (0,)
    assert status == "completed" and rollouts == 6 and mlflow_run_id
    # its MLflow run is on the stack's tracking server...
    mlflow = stack_env["MLFLOW_TRACKING_URI"]
    code, got = http("GET", f"{mlflow}/api/2.0/mlflow/runs/get?run_id={mlflow_run_id}")
    assert code == 200, got
    assert got["run"]["info"]["status"] == "FINISHED"
    tags = {t["key"]: t["value"] for t in got["run"]["data"]["tags"]}
    assert tags["vfops.run_id"] == run_id
    code, listed = http("GET", f"{mlflow}/api/2.0/mlflow/artifacts/list?run_id={mlflow_run_id}")
    assert "rollouts.parquet" in {f["path"] for f in listed["files"]}, listed
    # ...with its artifact in the stack's S3 (moto), under the MLflow bucket
    s3 = boto3.session.Session(
        aws_access_key_id=stack_env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=stack_env["AWS_SECRET_ACCESS_KEY"],
    ).client("s3", endpoint_url=stack_env["VFOPS_S3_ENDPOINT_URL"], region_name="us-east-1")
    try:
        bucket = read_state(stack)["buckets"]["mlflow"]
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
        assert any(mlflow_run_id in k and k.endswith("rollouts.parquet") for k in keys), keys
        # VFOPS_ARTIFACTS + VFOPS_S3_ENDPOINT_URL + the keys: an export lands in the stack's S3
        artifacts_bucket = read_state(stack)["buckets"]["artifacts"]
        exported = vfops(
            "runs", "export", run_id, "--to", f"s3://{artifacts_bucket}/exports", env=env
        )
        assert exported.returncode == 0, exported.stderr
        listed_export = s3.list_objects_v2(Bucket=artifacts_bucket, Prefix="exports/")
        assert listed_export.get("KeyCount", 0) > 0
    finally:
        s3.close()


def stack_client_env(stack: dict[str, Any]) -> dict[str, str]:
    printed = vfops("stack", "env", *stack_args(stack))
    assert printed.returncode == 0, printed.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_"))}
    env.update(env_from_lines(printed.stdout))
    return env


def flow_run_processes(stack_id: str) -> dict[int, dict[str, str]]:
    """The stack's flow-run processes (Prefect puts the run's id in their environment)."""
    found = {}
    for process in processes_of(stack_id):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            env = process.environ()
            if env.get("PREFECT__FLOW_RUN_ID"):
                found[process.pid] = env
    return found


def test_a_killed_worker_takes_its_flow_run_along_goes_offline_and_is_replaced(
    stack: dict[str, Any], tmp_path: Path
) -> None:
    env = stack_client_env(stack)
    deployed = vfops("deploy", env=env)  # onto the stack's pool, vfops-process
    assert deployed.returncode == 0, deployed.stderr
    api = env["PREFECT_API_URL"]
    with StubServer(StubConfig(reply_mode="arithmetic", latency_ms=250)) as stub:
        endpoints = tmp_path / "endpoints.toml"
        endpoints.write_text(
            f'[[endpoint]]\nalias = "stub"\nmodel = "stub-model"\nbase_url = "{stub.base_url}"\n'
        )
        _, deployment = http("GET", f"{api}/deployments/name/eval-sweep/eval-sweep")
        spec = {
            "environments": ["arithmetic"], "endpoints": ["stub"],
            "endpoints_file": str(endpoints), "num_examples": 200, "rollouts_per_example": 1,
            "max_concurrent": 1, "output_dir": str(tmp_path / "outputs"),
        }  # fmt: skip
        code, flow_run = http(
            "POST",
            f"{api}/deployments/{deployment['id']}/create_flow_run",
            {"parameters": {"spec": spec}},
        )
        assert code == 201, flow_run
        deadline = time.monotonic() + 120
        while not (runs := flow_run_processes(stack["stack_id"])):
            assert time.monotonic() < deadline, "no worker started the flow run"
            time.sleep(0.5)
        # the flow run's process (and any it started, e.g. the MLflow tracker in a
        # session of its own) carries the run's id and the name of the worker that took it
        assert {e["PREFECT__FLOW_RUN_ID"] for e in runs.values()} == {flow_run["id"]}
        (worker,) = {e["VFOPS_WORKER_NAME"] for e in runs.values()}
        other = ({"worker-1", "worker-2"} - {worker}).pop()
        killed = vfops("stack", "kill-worker", worker, *stack_args(stack))
    assert killed.returncode == 0, killed.stderr
    assert flow_run_processes(stack["stack_id"]) == {}
    for pid in runs:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert processes_of(stack["stack_id"], worker) == []
    assert processes_of(stack["stack_id"], other) != []
    deadline = time.monotonic() + 90
    while (workers := pool_workers(stack))[worker] != "OFFLINE":
        assert time.monotonic() < deadline, f"{worker} never went offline: {workers}"
        time.sleep(1)
    assert workers[other] == "ONLINE"
    status = vfops("stack", "status", *stack_args(stack))
    assert f"{worker}" in status.stdout and "OFFLINE" in status.stdout, status.stdout
    # a lost machine is replaced: up tops the workers up to the number asked for
    added = vfops("stack", "up", *stack_args(stack), "--workers", "2")
    assert added.returncode == 0, added.stderr
    assert "started worker-3" in added.stdout, added.stdout
    assert pool_workers(stack)["worker-3"] == "ONLINE"
    unknown = vfops("stack", "kill-worker", worker, *stack_args(stack))
    assert unknown.returncode != 0
    assert unknown.stderr.strip() == (
        f"error: stack {stack['name']} has no worker {worker!r} (workers: {other}, worker-3); "
        "see vfops stack status"
    )


def test_down_leaves_no_process_and_purge_drops_the_databases(stack: dict[str, Any]) -> None:
    assert processes_of(stack["stack_id"])
    down = vfops("stack", "down", *stack_args(stack))
    assert down.returncode == 0, down.stderr
    assert processes_of(stack["stack_id"]) == []
    assert len(databases(f"{stack['name']}_")) == 3  # kept without --purge
    assert read_state(stack)["services"] == {}
    purged = vfops("stack", "down", *stack_args(stack), "--purge")
    assert purged.returncode == 0, purged.stderr
    assert databases(f"{stack['name']}_") == set()
    assert not stack["dir"].exists()


def test_a_wrong_prefect_database_fails_up_in_one_line(tmp_path: Path) -> None:
    require_postgres()
    name = f"vfops_stack_b{uuid.uuid4().hex[:8]}"
    directory = tmp_path / "broken"
    wrong = f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}_no_such_database"
    stack_id = None
    try:
        up = vfops(
            "stack", "up", "--dir", str(directory), "--workers", "1", "--name", name,
            "--postgres-url", ADMIN_URL,
            "--service-env", f"prefect:PREFECT_API_DATABASE_CONNECTION_URL={wrong}",
        )  # fmt: skip
        stack_id = json.loads((directory / "stack.json").read_text())["stack_id"]
        assert up.returncode == 2, up.stdout + up.stderr
        (line,) = up.stderr.strip().splitlines()
        log = directory.resolve() / "logs" / "prefect.log"
        assert line.startswith("error: prefect exited"), line
        assert f"see its log {log}" in line, line
        assert f'database "{name}_no_such_database" does not exist' in line  # the log's clue
        assert processes_of(stack_id) == []  # what up started is stopped again
        assert read_state({"dir": directory})["services"] == {}
    finally:
        cleanup(directory, name, stack_id)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--name", "Bad-Name"], "stack name 'Bad-Name' is not valid"),
        (
            ["--postgres-url", "postgresql://postgres:hunter2@127.0.0.1/postgres"],
            "--postgres-url must not contain a password",
        ),
        (
            ["--postgres-url", "postgresql://postgres@127.0.0.1:1/postgres"],
            "PostgreSQL is not reachable at postgresql://postgres@127.0.0.1:1/postgres (",
        ),
        (["--workers", "-1"], "--workers must be 0 or more, not -1"),
        (["--service-env", "nope"], "--service-env 'nope' is not SERVICE:NAME=VALUE"),
        (["--service-env", "db:X=1"], "unknown service 'db' in --service-env"),
    ],
)
def test_bad_input_is_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    result = vfops("stack", "up", "--dir", str(tmp_path / "s"), *args, timeout=60)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {message}"), line
    assert "hunter2" not in result.stderr + result.stdout
    assert not (tmp_path / "s" / "stack.json").exists()
