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
import re
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.request_gate import RequestGate, by_temperature
from vfops._json_http import json_request
from vfops.testing import StubConfig, StubServer

pytestmark = pytest.mark.tracking  # what these tests check is in MLflow (tests/conftest.py)

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
    return json_request(method, url, body, timeout_s=10, proxies=False)


def stack_s3(env: dict[str, str]) -> Any:
    """A boto3 S3 client on the stack's moto server, with the keys its env lines give."""
    import boto3

    return boto3.session.Session(
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    ).client("s3", endpoint_url=env["VFOPS_S3_ENDPOINT_URL"], region_name="us-east-1")


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
            "--worker-limit", "2", "--service-env", "worker:VFOPS_STACK_TEST_MARK=1",
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
        assert env["PREFECT_WORKER_QUERY_SECONDS"] == "1"  # the stack's default
        assert env["VFOPS_STACK_TEST_MARK"] == "1"  # --service-env worker:...
        assert main.cmdline()[-2:] == ["--limit", "2"]  # --worker-limit
        assert os.getsid(main.pid) == main.pid  # a session of its own
    status = vfops("stack", "status", *stack_args(stack))
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.count("  ok ") == 5, status.stdout
    assert "flow runs started by the engine launcher" in status.stdout, status.stdout
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
    s3 = stack_s3(stack_env)
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


@pytest.mark.timeout(600)  # its waits are safety nets sized for a busy machine
def test_a_cell_is_started_by_its_worker_as_one_interpreter(
    stack: dict[str, Any], tmp_path: Path
) -> None:
    """The stack's launcher (infra/README.md, "Cells that start in seconds"): its pool's
    command starts a cell's flow run as Prefect's engine (``python -m
    vfops.orchestration._engine``), by the worker itself and in the worker's session,
    instead of Prefect's workspace supervisor (a first
    interpreter that prepares the run, then execs the engine in a session of its own,
    with ``PREFECT__FLOW_ENTRYPOINT`` set). The cell is held at its first model call
    while its process is looked at, then runs to the end and records its worker."""
    env = stack_client_env(stack)
    deployed = vfops("deploy", env=env)
    assert deployed.returncode == 0, deployed.stderr
    state = read_state(stack)
    pool = prefect_api(env, "GET", f"/work_pools/{state['pool']}")
    command = pool["base_job_template"]["variables"]["properties"]["command"]["default"]
    assert shlex.split(command) == [sys.executable, "-m", "vfops.orchestration._engine"]
    tag = f"stack-launch-{uuid.uuid4().hex[:6]}"
    with (
        StubServer(StubConfig(reply_mode="arithmetic")) as stub,
        RequestGate(stub) as gate,  # closed: the cell's first model call waits
    ):
        endpoints = tmp_path / "endpoints.toml"
        endpoints.write_text(
            f'[[endpoint]]\nalias = "stub"\nmodel = "stub-model"\nbase_url = "{stub.base_url}"\n'
        )
        cell = {
            "env_ref": "arithmetic", "env_name": "arithmetic", "ref_kind": "installed",
            "endpoint": "stub", "endpoints_file": str(endpoints),
            "sampling": {"name": "t0", "args": {"temperature": 0.0}},
            "num_examples": 1, "rollouts_per_example": 1, "max_concurrent": 1, "tags": [tag],
        }  # fmt: skip
        deployment = prefect_api(env, "GET", "/deployments/name/eval-sweep-cell/eval-sweep-cell")
        run = prefect_api(
            env, "POST", f"/deployments/{deployment['id']}/create_flow_run",
            {"parameters": {"cell": cell, "output_dir": str(tmp_path / "outputs")}},
        )  # fmt: skip
        deadline = time.monotonic() + 300  # a safety net: the gate holds the cell
        while gate.stats()[1] == 0:
            assert time.monotonic() < deadline, "the cell never called the model"
            time.sleep(0.2)
        engines = [
            (pid, e)
            for pid, e in flow_run_processes(stack["stack_id"]).items()
            if e["PREFECT__FLOW_RUN_ID"] == run["id"]
            and psutil.Process(pid).cmdline()[1:] == ["-m", "vfops.orchestration._engine"]
        ]
        assert len(engines) == 1, engines
        ((pid, run_env),) = engines
        worker = state["services"][run_env["VFOPS_WORKER_NAME"]]
        assert psutil.Process(pid).ppid() == worker["pid"]  # no launcher in between
        assert os.getsid(pid) == os.getsid(worker["pid"]) == worker["pid"]  # the worker's session
        assert "PREFECT__FLOW_ENTRYPOINT" not in run_env  # set by the workspace supervisor
        gate.open()
        deadline = time.monotonic() + 300
        while (got := prefect_api(env, "GET", f"/flow_runs/{run['id']}"))["state_type"] not in {
            "COMPLETED", "FAILED", "CRASHED", "CANCELLED"
        }:  # fmt: skip
            assert time.monotonic() < deadline, f"the cell did not finish: {got['state']}"
            time.sleep(0.5)
    assert got["state_type"] == "COMPLETED", got["state"]
    (registry_run,) = registry_runs(env, tag)
    assert registry_run["status"] == "completed" and registry_run["rollouts"] == 1
    assert workers_of(registry_run) == {run_env["VFOPS_WORKER_NAME"]}


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


SWEEP_N, SWEEP_R = 30, 2  # 60 model calls, 2 at a time at 250 ms: ~8 s of rollouts per cell
SWEEP_HELD_AFTER = 20  # model calls a cell makes while the gates are closed (of N x R)
SWEEP_HEARTBEAT_TIMEOUT_S = 50  # flow-run heartbeats come every 30 s on the stack


def sweep_parameters(endpoints: Path, outputs: Path, tag: str) -> dict[str, Any]:
    """A 12-cell distributed sweep: 1 environment x 2 endpoints x 6 sampling configs."""
    temperatures = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    return {
        "spec": {
            "environments": ["arithmetic"],
            "endpoints": ["stub-a", "stub-b"],
            "endpoints_file": str(endpoints),
            "sampling": [{"name": f"t{t}", "args": {"temperature": t}} for t in temperatures],
            "num_examples": SWEEP_N,
            "rollouts_per_example": SWEEP_R,
            "max_concurrent": 2,
            "max_parallel_cells": 3,
            "distribute": True,
            "tags": [tag],
            "output_dir": str(outputs),
        }
    }


def registry_runs(env: dict[str, str], tag: str) -> list[dict[str, Any]]:
    """The registry runs of the sweep tagged ``tag``: id, status, tags, MLflow run, rollouts."""
    import psycopg

    url = env["VFOPS_DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            "SELECT r.id, r.status, r.tags, r.mlflow_run_id, r.lease_owner, "
            "(SELECT count(*) FROM rollouts o WHERE o.run_id = r.id), "
            "(SELECT count(DISTINCT (o.example_id, o.rollout_index)) FROM rollouts o "
            " WHERE o.run_id = r.id), r.base_url, r.sampling_args FROM eval_runs r"
        ).fetchall()
    return [dict(zip(RUN_COLUMNS, r, strict=True)) for r in rows if tag in (r[2] or [])]


RUN_COLUMNS = (
    "id", "status", "tags", "mlflow_run_id", "lease_owner", "rollouts", "distinct", "base_url",
    "sampling_args",
)  # fmt: skip


def workers_of(run: dict[str, Any]) -> set[str]:
    return {t.split(":", 1)[1] for t in run["tags"] or [] if t.startswith("worker:")}


def say(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", flush=True)


def prefect_api(env: dict[str, str], method: str, path: str, body: Any = None) -> Any:
    code, got = http(method, f"{env['PREFECT_API_URL']}{path}", body)
    assert 200 <= code < 300, (code, got)
    return got


@pytest.mark.timeout(1200)  # 12 flow-run processes, a crash detected by missed heartbeats
def test_a_distributed_sweep_spreads_over_the_workers_and_survives_a_lost_one(
    stack: dict[str, Any], tmp_path: Path
) -> None:
    """The bar of the scale-out issue, with the commands of infra/README.md's
    "Distributed sweep on the stack": 12 cells over two workers (each runs at least 3),
    then the worker that does not run the sweep's own flow run is killed mid-cell; its
    cells crash, are rescheduled and resumed elsewhere, and every cell ends with exactly
    N x R rollouts in one registry run, one MLflow run on the stack's server with its
    artifact in the stack's S3, and the sweep's artifacts on the parent flow run."""
    from vfops.flows.eval_sweep import REPORT_KEY, TABLE_KEY

    env = stack_client_env(stack)
    deployed = vfops("deploy", "--heartbeat-timeout-s", str(SWEEP_HEARTBEAT_TIMEOUT_S), env=env)
    assert deployed.returncode == 0, deployed.stderr
    tag = f"stack-sweep-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    # two servers: a run's identity is its model and endpoint, so two aliases of one
    # server would be one run per sampling config, reused by the second cell. Each has a
    # gate, open until the victim has finished 3 cells; closed, every cell stops after
    # SWEEP_HELD_AFTER model calls (a cell is one server and one temperature), so the
    # victim's cells stand still mid-cell until the kill has landed, however busy the
    # machine (looking for a moment when they happen to be midway missed it under load:
    # "the sweep ended early: COMPLETED")
    with (
        StubServer(StubConfig(reply_mode="arithmetic", latency_ms=250)) as stub_a,
        StubServer(StubConfig(reply_mode="arithmetic", latency_ms=250)) as stub_b,
        RequestGate(stub_a, allow=SWEEP_HELD_AFTER, key=by_temperature, closed=False) as gate_a,
        RequestGate(stub_b, allow=SWEEP_HELD_AFTER, key=by_temperature, closed=False) as gate_b,
    ):
        gates = {stub_a.base_url: gate_a, stub_b.base_url: gate_b}
        endpoints = tmp_path / "endpoints.toml"
        endpoints.write_text(
            "".join(
                f'[[endpoint]]\nalias = "{alias}"\nmodel = "stub-model"\n'
                f'base_url = "{stub.base_url}"\n'
                for alias, stub in (("stub-a", stub_a), ("stub-b", stub_b))
            )
        )
        parameters = sweep_parameters(endpoints, tmp_path / "outputs", tag)
        triggered = subprocess.run(
            [sys.executable, "-m", "prefect", "deployment", "run", "eval-sweep/eval-sweep",
             "--params", json.dumps(parameters)],
            capture_output=True, text=True, env=env, timeout=120, check=False,
        )  # fmt: skip
        assert triggered.returncode == 0, triggered.stderr + triggered.stdout
        found = re.search(r"UUID: ([0-9a-f-]{36})", triggered.stdout)
        assert found, triggered.stdout
        parent = found.group(1)

        # the worker running the sweep's own flow run stays; the other one will be lost
        deadline = time.monotonic() + 300
        while not (
            hosts := {
                e["VFOPS_WORKER_NAME"]
                for e in flow_run_processes(stack["stack_id"]).values()
                if e["PREFECT__FLOW_RUN_ID"] == parent
            }
        ):
            assert time.monotonic() < deadline, "no worker started the sweep"
            time.sleep(1)
        (keeper,) = hosts
        victim = ({"worker-1", "worker-2"} - {keeper}).pop()
        say(f"the sweep {parent} runs on {keeper}; {victim} will be lost")

        def calls_left(run: dict[str, Any]) -> bool:
            """Whether the run's cell has model calls still to make (held: it cannot end)."""
            gate = gates[run["base_url"]]
            seen, _ = gate.stats()
            temperature = (run["sampling_args"] or {}).get("temperature")
            return seen.get(temperature, 0) < SWEEP_N * SWEEP_R

        # kill it once it has finished 3 cells and is in the middle of two, its limit (so
        # it holds no run it has taken but not started yet: a Pending run has no
        # heartbeat to be missed, see infra/README.md)
        deadline = time.monotonic() + 600  # a safety net: the gates make the state come
        closed = False
        while True:
            assert time.monotonic() < deadline, (
                "the victim never ran 3 cells" if not closed else "the victim never held 2 cells"
            )
            runs = registry_runs(env, tag)
            done = [r for r in runs if r["status"] == "completed" and victim in workers_of(r)]
            if len(done) >= 3 and not closed:
                for gate in gates.values():
                    gate.close()
                closed = True
                say(f"{victim} finished {len(done)} cells: the gates hold every cell now")
                continue  # look again: a cell may have gone on before the gates closed
            children = prefect_api(
                env, "POST", "/flow_runs/filter",
                {"flow_runs": {"parent_flow_run_id": {"any_": [parent]}}},
            )  # fmt: skip
            states = {c["id"]: c["state_type"] for c in children}
            parent_state = prefect_api(env, "GET", f"/flow_runs/{parent}")["state"]["type"]
            assert parent_state in {"PENDING", "RUNNING"}, f"the sweep ended early: {parent_state}"
            processes = {
                pid: e["PREFECT__FLOW_RUN_ID"]
                for pid, e in flow_run_processes(stack["stack_id"]).items()
                if e["VFOPS_WORKER_NAME"] == victim
            }
            on_victim = set(processes.values())
            # a cell evaluates in its flow-run process, which holds its run's lease
            # (host@pid:token); the worker is tagged on the run once it is done. With
            # the gates closed, a cell with rollouts stored and calls still to make
            # stands still mid-cell: it cannot finish before the kill lands
            mid_cell = [
                r for r in runs
                if r["status"] == "running" and r["rollouts"] > 0 and calls_left(r)
                and any(f"@{pid}:" in (r["lease_owner"] or "") for pid in processes)
            ]  # fmt: skip
            if (
                closed
                and mid_cell
                and len(on_victim) == 2
                and all(states.get(i) == "RUNNING" for i in on_victim)
            ):
                break
            if int(time.monotonic() - started) % 15 == 0:
                say(
                    f"{len(done)} cells done on {victim}, {len(on_victim)} running, "
                    f"{len(mid_cell)} mid-cell; {len(runs)} registry runs"
                )
            time.sleep(0.5)
        assert len(runs) < 12 or any(r["status"] != "completed" for r in runs), "not mid-sweep"
        killed = vfops("stack", "kill-worker", victim, *stack_args(stack))
        assert killed.returncode == 0, killed.stderr
        killed_at = time.monotonic()
        # lost: the victim's cells that had not completed when the kill landed; one that
        # finished in between (its last MLflow write, say) completed on its own worker
        after_kill = prefect_api(
            env, "POST", "/flow_runs/filter",
            {"flow_runs": {"parent_flow_run_id": {"any_": [parent]}}},
        )  # fmt: skip
        lost = sorted(
            c["id"] for c in after_kill if c["id"] in on_victim and c["state_type"] != "COMPLETED"
        )
        assert lost, f"both of {sorted(on_victim)} completed before the kill landed"
        say(f"killed {victim} while it ran {lost}; {len(runs)} registry runs")
        for gate in gates.values():
            gate.open()
        # a lost machine is replaced (as an operator, or an autoscaler, would)
        replaced = vfops("stack", "up", *stack_args(stack), "--workers", "2")
        assert replaced.returncode == 0, replaced.stderr

        deadline = time.monotonic() + 600
        while (state := prefect_api(env, "GET", f"/flow_runs/{parent}")["state"])["type"] not in {
            "COMPLETED", "FAILED", "CRASHED", "CANCELLED"
        }:  # fmt: skip
            assert time.monotonic() < deadline, f"the sweep did not finish: {state}"
            if int(time.monotonic() - started) % 15 == 0:
                done = [r for r in registry_runs(env, tag) if r["status"] == "completed"]
                say(f"waiting for the sweep: {len(done)} cells completed")
            time.sleep(1)
    print(
        f"\n12-cell distributed sweep on the stack: {time.monotonic() - started:.1f} s, "
        f"{time.monotonic() - killed_at:.1f} s after {victim} was killed"
    )
    assert state["type"] == "COMPLETED", state["message"]

    # every cell: one completed registry run with exactly N x R distinct rollouts
    runs = registry_runs(env, tag)
    assert len(runs) == 12, [r["id"] for r in runs]
    for run in runs:
        assert run["status"] == "completed", run
        assert run["rollouts"] == run["distinct"] == SWEEP_N * SWEEP_R, run
    # spread over both workers, each at least 3 cells; the worker is on every run
    per_worker = {w: sum(w in workers_of(r) for r in runs) for w in ("worker-1", "worker-2")}
    assert all(count >= 3 for count in per_worker.values()), per_worker
    assert all(workers_of(r) for r in runs)
    # the cells lost with the victim crashed, were started again and finished elsewhere
    children = prefect_api(
        env, "POST", "/flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [parent]}}}
    )
    assert len(children) == 12 and {c["state_type"] for c in children} == {"COMPLETED"}
    for flow_run_id in lost:
        history = prefect_api(env, "GET", f"/flow_run_states/?flow_run_id={flow_run_id}")
        assert "CRASHED" in {s["type"] for s in history}, flow_run_id
        (run,) = [r for r in runs if f"prefect.flow_run_id:{flow_run_id}" in r["tags"]]
        assert workers_of(run) - {victim}, run  # resumed by another worker

    # every cell is one MLflow run on the stack's server, its rollouts in the stack's S3
    mlflow = env["MLFLOW_TRACKING_URI"]
    s3 = stack_s3(env)
    try:
        bucket = read_state(stack)["buckets"]["mlflow"]
        paginator = s3.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=bucket)
        keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    finally:
        s3.close()
    code, experiments = http(
        "POST", f"{mlflow}/api/2.0/mlflow/experiments/search", {"max_results": 1000}
    )
    assert code == 200, experiments
    experiment_ids = [e["experiment_id"] for e in experiments["experiments"]]
    for run in runs:
        code, found_runs = http(
            "POST",
            f"{mlflow}/api/2.0/mlflow/runs/search",
            {"experiment_ids": experiment_ids, "filter": f"tags.`vfops.run_id` = '{run['id']}'"},
        )
        assert code == 200, found_runs
        (mlflow_run,) = found_runs["runs"]  # exactly one, also for a resumed cell
        assert mlflow_run["info"]["run_id"] == run["mlflow_run_id"]
        assert mlflow_run["info"]["status"] == "FINISHED"
        assert any(
            run["mlflow_run_id"] in key and key.endswith("rollouts.parquet") for key in keys
        ), run

    # the sweep's table and report are on its own flow run, one row per cell
    artifacts = prefect_api(
        env, "POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [parent]}}}
    )
    by_key = {a["key"]: a for a in artifacts}
    assert {TABLE_KEY, REPORT_KEY} <= set(by_key)
    data = by_key[TABLE_KEY]["data"]
    rows = json.loads(data) if isinstance(data, str) else data
    assert len(rows) == len(runs)
    # run ids: in the report (the table keeps the key columns, to fit the pane)
    report = str(by_key[REPORT_KEY]["data"])
    assert all(f"run `{run['id']}`" in report for run in runs)


@pytest.mark.timeout(900)  # its waits are safety nets sized for a busy machine
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
        deadline = time.monotonic() + 300  # a safety net for a busy machine
        while not (runs := flow_run_processes(stack["stack_id"])):
            assert time.monotonic() < deadline, "no worker started the flow run"
            time.sleep(0.5)
        # the flow run's process (and any it started, e.g. the MLflow tracker in a
        # session of its own) carries the run's id and the name of the worker that took it
        assert {e["PREFECT__FLOW_RUN_ID"] for e in runs.values()} == {flow_run["id"]}
        (worker,) = {e["VFOPS_WORKER_NAME"] for e in runs.values()}
        current = {name for name in read_state(stack)["services"] if name.startswith("worker-")}
        (other,) = current - {worker}
        killed = vfops("stack", "kill-worker", worker, *stack_args(stack))
    assert killed.returncode == 0, killed.stderr
    assert flow_run_processes(stack["stack_id"]) == {}
    for pid in runs:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert processes_of(stack["stack_id"], worker) == []
    assert processes_of(stack["stack_id"], other) != []
    deadline = time.monotonic() + 240  # 3 missed 5 s heartbeats, then the server's sweep
    while (workers := pool_workers(stack))[worker] != "OFFLINE":
        assert time.monotonic() < deadline, f"{worker} never went offline: {workers}"
        time.sleep(1)
    assert workers[other] == "ONLINE"
    status = vfops("stack", "status", *stack_args(stack))
    assert f"{worker}" in status.stdout and "OFFLINE" in status.stdout, status.stdout
    # a lost machine is replaced: up tops the workers up to the number asked for
    replacement = f"worker-{read_state(stack)['next_worker']}"
    added = vfops("stack", "up", *stack_args(stack), "--workers", "2")
    assert added.returncode == 0, added.stderr
    assert f"started {replacement}" in added.stdout, added.stdout
    assert pool_workers(stack)[replacement] == "ONLINE"
    unknown = vfops("stack", "kill-worker", worker, *stack_args(stack))
    assert unknown.returncode != 0
    assert unknown.stderr.strip() == (
        f"error: stack {stack['name']} has no worker {worker!r} "
        f"(workers: {', '.join(sorted([other, replacement]))}); "
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
        (
            ["--flow-run-launcher", "fork"],
            "--flow-run-launcher must be one of engine, workspace, not 'fork'",
        ),
        (["--worker-limit", "0"], "--worker-limit must be 1 or more, not 0"),
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
