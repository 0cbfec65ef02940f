"""End to end on a real Prefect server: ``vfops deploy``, a process worker, the API.

Starts ``prefect server start`` on loopback, registers every deployment with
``vfops deploy``, starts ``prefect worker start``, triggers ``eval-sweep`` through
the API with parameters, and checks the registry and the flow run's artifacts.
Then kills the worker (and its flow-run process) mid-sweep, re-runs the same flow
run on a new worker, and checks each cell ends with exactly N x R rollouts.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlalchemy import text

from tests.registry_fixtures import stored_count, stored_rollouts
from tests.request_gate import RequestGate, by_temperature
from vfops.registry import dispose_engines, get_engine
from vfops.testing import StubConfig, StubServer

BIN = Path(sys.executable).parent
POOL = "e2e-pool"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A Prefect server on loopback, a registry, a stub model and the process env for both."""
    with serve_stack(tmp_path_factory.mktemp("e2e")) as served:
        yield served


@contextlib.contextmanager
def serve_stack(
    root: Path, env: dict[str, str] | None = None, latency_ms: int = 40
) -> Iterator[dict[str, Any]]:
    """:func:`stack`'s body, for other modules' fixtures (``env``: extra variables,
    ``latency_ms``: the stub model's latency per request)."""
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(root / "prefect-home"),
        "PREFECT_API_URL": api,
        "PREFECT_SERVER_UI_API_URL": api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "VFOPS_DATABASE_URL": f"sqlite:///{root / 'registry.db'}",
        "VFOPS_HOME": str(root / "vfops-home"),
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    env.pop("OPENAI_API_KEY", None)
    log = (root / "server.log").open("w")
    server = subprocess.Popen(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240  # a safety net for a busy machine
        while True:
            try:
                with urllib.request.urlopen(f"{api}/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError((root / "server.log").read_text()[-3000:]) from None
                time.sleep(0.5)
        with StubServer(StubConfig(reply_mode="arithmetic", latency_ms=latency_ms)) as stub:
            endpoints = root / "endpoints.toml"
            endpoints.write_text(
                '[[endpoint]]\nalias = "stub"\nmodel = "stub-model"\n'
                f'base_url = "{stub.base_url}"\n'
            )
            yield {"env": env, "root": root, "stub": stub, "endpoints": endpoints, "api": api}
    finally:
        kill_tree(server.pid)
        server.wait(timeout=30)
        log.close()
        dispose_engines()


def kill_tree(pid: int) -> None:
    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    for process in [*parent.children(recursive=True), parent]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs([parent], timeout=10)


class Worker:
    """A ``prefect worker start`` process; ``kill`` takes its flow-run processes too."""

    def __init__(
        self,
        stack: dict[str, Any],
        name: str,
        *,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self._log = (stack["root"] / f"{name}.log").open("w")
        # the flow-run processes a worker starts inherit this marker (they run in a
        # session of their own, so killing the process group is not enough)
        self.marker = f"{name}-{os.getpid()}"
        self.process = subprocess.Popen(
            [str(BIN / "prefect"), "worker", "start", "--pool", POOL, "--name", name, *args],
            env={**stack["env"], **(env or {}), "VFOPS_E2E_WORKER": self.marker},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self) -> None:
        if self._log.closed:  # killed already
            return
        kill_tree(self.process.pid)
        for process in psutil.process_iter():
            try:
                if process.environ().get("VFOPS_E2E_WORKER") == self.marker:
                    process.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        self.process.wait(timeout=30)
        self._log.close()


def start_worker(stack: dict[str, Any], name: str) -> Worker:
    return Worker(stack, name)


def rest(stack: dict[str, Any], method: str, path: str, body: Any = None) -> Any:
    """Call the Prefect REST API (what the UI and every client use); like Prefect's own
    client, retry what a busy server answers (503 when its SQLite database is locked)."""
    for attempt in range(6):
        request = urllib.request.Request(
            f"{stack['api']}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            if exc.code not in (429, 502, 503) or attempt == 5:
                raise
            time.sleep(0.5 * 2**attempt)
            continue
        return json.loads(payload) if payload else None
    raise AssertionError("unreachable")


def sweep(stack: dict[str, Any], n: int, r: int, c: int) -> dict[str, Any]:
    return {
        "spec": {
            "environments": ["arithmetic"],
            "endpoints": ["stub"],
            "endpoints_file": str(stack["endpoints"]),
            "sampling": [{"name": "cold", "args": {"temperature": 0.0}}, {"name": "warm"}],
            "num_examples": n,
            "rollouts_per_example": r,
            "max_concurrent": c,
            "output_dir": str(stack["root"] / "outputs"),
        }
    }


def trigger(
    stack: dict[str, Any], parameters: dict[str, Any], work_queue: str | None = None
) -> str:
    """Create a flow run of the eval-sweep deployment, as the UI's form does (on
    ``work_queue`` of the pool when given)."""
    deployment = rest(stack, "GET", "/deployments/name/eval-sweep/eval-sweep")
    body: dict[str, Any] = {"parameters": parameters}
    if work_queue is not None:
        body["work_queue_name"] = work_queue
    flow_run = rest(stack, "POST", f"/deployments/{deployment['id']}/create_flow_run", body)
    return str(flow_run["id"])


def wait_for(stack: dict[str, Any], flow_run_id: str, timeout_s: float = 240) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = rest(stack, "GET", f"/flow_runs/{flow_run_id}")["state"] or {}
        if state.get("type") in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}:
            return state
        time.sleep(1)
    raise AssertionError(f"flow run {flow_run_id} did not finish; last state {state}")


def cell_runs(stack: dict[str, Any]) -> dict[str, int]:
    engine = get_engine(stack["env"]["VFOPS_DATABASE_URL"])
    with engine.connect() as connection:
        ids = connection.execute(text("SELECT id FROM eval_runs")).scalars().all()
    return {run_id: stored_count(engine, run_id) for run_id in ids}


def test_deploy_worker_and_trigger_through_the_api(stack: dict[str, Any]) -> None:
    nightly = stack["root"] / "nightly.toml"
    nightly.write_text(
        '[nightly]\nenvironments = ["arithmetic"]\nendpoints = ["stub"]\n'
        f'endpoints_file = "{stack["endpoints"]}"\nnum_examples = 20\nrollouts_per_example = 4\n'
    )
    deployed = subprocess.run(
        [
            str(BIN / "vfops"),
            "deploy",
            "--work-pool",
            POOL,
            "--nightly-config",
            str(nightly),
            "--nightly-cron",
            "0 4 * * *",
        ],
        env=stack["env"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert deployed.returncode == 0, deployed.stderr
    for name in (
        "eval-sweep/eval-sweep",
        "publish-environment/publish-environment",
        "judge-score/judge-score",
        "nightly-eval/nightly-eval",
        "train-evaluate-promote/train-evaluate-promote",
    ):
        assert f"deployed {name}" in deployed.stdout
    # one summary, not Prefect's table and hints per deployment
    assert "Successfully created" not in deployed.stdout + deployed.stderr
    assert "Deployments" not in deployed.stdout and "prefect deployment run" not in deployed.stdout
    nightly_deployment = rest(stack, "GET", "/deployments/name/nightly-eval/nightly-eval")
    assert [s["schedule"]["cron"] for s in nightly_deployment["schedules"]] == ["0 4 * * *"]
    assert nightly_deployment["parameters"]["config"]["num_examples"] == 20
    worker = start_worker(stack, "worker-1")
    try:
        flow_run_id = trigger(stack, sweep(stack, n=4, r=2, c=4))
        final = wait_for(stack, flow_run_id)
        assert final["type"] == "COMPLETED", final["message"]
    finally:
        worker.kill()
    runs = cell_runs(stack)
    assert sorted(runs.values()) == [8, 8]

    artifacts = rest(
        stack, "POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}}
    )
    found = {a["key"]: a for a in artifacts}
    table = found["eval-sweep-results"]["data"]
    rows = json.loads(table) if isinstance(table, str) else table
    assert sorted(row["rollouts"] for row in rows) == [8, 8]
    report = found["eval-sweep-report"]["data"]  # run ids: in the report, not the table
    assert all(f"run `{run_id}`" in report for run_id in runs)


def new_cells(stack: dict[str, Any], before: set[str]) -> dict[str, int]:
    return {k: v for k, v in cell_runs(stack).items() if k not in before}


def test_killed_worker_then_rerun_gives_exactly_n_times_r(stack: dict[str, Any]) -> None:
    before = set(cell_runs(stack))
    n, r = 40, 2
    # the stub answers each cell's first 24 model calls, then holds the rest until the
    # kill has landed: the sweep stands still mid-cell, however busy the machine (it
    # could finish between a look at its progress and the kill)
    with RequestGate(stack["stub"], allow=24, key=by_temperature):
        worker = start_worker(stack, "worker-2")
        flow_run_id = trigger(stack, sweep(stack, n=n, r=r, c=2))
        deadline = time.monotonic() + 240  # a safety net: the gate makes the state come
        while sum((new := new_cells(stack, before)).values()) < 20:
            assert time.monotonic() < deadline, f"the sweep stored no 20 rollouts: {new}"
            time.sleep(0.2)
        worker.kill()  # the worker and the flow-run process it started, like a lost machine
    partial = new_cells(stack, before)
    assert 0 < sum(partial.values()) < 2 * n * r

    # re-run the same flow run (the UI's "Retry"): back to Scheduled for a new worker
    rest(
        stack,
        "POST",
        f"/flow_runs/{flow_run_id}/set_state",
        {"state": {"type": "SCHEDULED"}, "force": True},
    )
    worker = start_worker(stack, "worker-3")
    try:
        final = wait_for(stack, flow_run_id)
        assert final["type"] == "COMPLETED", final["message"]
    finally:
        worker.kill()
    runs = {k: v for k, v in cell_runs(stack).items() if k not in before}
    assert sorted(runs.values()) == [n * r, n * r]  # resumed, not restarted: one run per cell
    engine = get_engine(stack["env"]["VFOPS_DATABASE_URL"])
    for run_id in runs:
        keys = [(rec.example_id, rec.rollout_index) for rec in stored_rollouts(engine, run_id)]
        assert len(keys) == len(set(keys)) == n * r
