"""Distributed sweeps on a real Prefect server: cells fan out, a lost worker is recovered.

A real ``prefect server start`` (its triggers and actions services run the automations),
``vfops deploy`` (deployments + the zombie and reschedule automations), real process
workers and a SQLite registry, a stub model. The sweep's own flow run goes to a
``sweeps`` work queue served by one worker; two cell workers (``--limit 1``: one cell at
a time each, so both take cells) serve the default queue, each with its own
``VFOPS_WORKER_NAME``. Heartbeats every 30 s (Prefect's minimum) and a 50 s heartbeat
timeout keep the recovery test near two minutes.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from tests.registry_fixtures import stored_rollouts
from tests.request_gate import RequestGate, by_temperature
from tests.test_prefect_e2e import (
    BIN,
    POOL,
    Worker,
    cell_runs,
    rest,
    serve_stack,
    trigger,
    wait_for,
)
from vfops.registry import EvalRunRow, get_engine

HEARTBEAT_S = 30
HEARTBEAT_TIMEOUT_S = 50
SWEEP_QUEUE = "sweeps"
WORKER_ENV = {
    "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S),
    "PREFECT_WORKER_QUERY_SECONDS": "2",
}


@pytest.fixture(scope="module")
def fanout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The e2e stack with everything deployed, a ``sweeps`` queue and its worker."""
    # 150 ms per model call: a cell lasts long enough to lose its worker midway
    with serve_stack(tmp_path_factory.mktemp("fanout"), latency_ms=150) as stack:
        deployed = subprocess.run(
            [
                str(BIN / "vfops"),
                "deploy",
                "--work-pool",
                POOL,
                "--heartbeat-timeout-s",
                str(HEARTBEAT_TIMEOUT_S),
            ],
            env=stack["env"],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert deployed.returncode == 0, deployed.stderr
        stack["deploy_stdout"] = deployed.stdout
        rest(stack, "POST", f"/work_pools/{POOL}/queues", {"name": SWEEP_QUEUE})
        parent = Worker(stack, "sweeper", args=("--work-queue", SWEEP_QUEUE), env={**WORKER_ENV})
        try:
            yield stack
        finally:
            parent.kill()


def cell_worker(stack: dict[str, Any], name: str) -> Worker:
    return Worker(
        stack,
        name,
        args=("--work-queue", "default", "--limit", "1"),
        env={**WORKER_ENV, "VFOPS_WORKER_NAME": name},
    )


def distributed_sweep(
    stack: dict[str, Any], n: int, r: int, tag: str, concurrent: int = 2
) -> dict[str, Any]:
    return {
        "spec": {
            "environments": ["arithmetic"],
            "endpoints": ["stub"],
            "endpoints_file": str(stack["endpoints"]),
            "sampling": [
                {"name": "cold", "args": {"temperature": 0.0}},
                {"name": "warm", "args": {"temperature": 0.7}},
                {"name": "hot", "args": {"temperature": 1.0}},
            ],
            "num_examples": n,
            "rollouts_per_example": r,
            "max_concurrent": concurrent,
            "max_parallel_cells": 3,
            "distribute": True,
            "tags": [tag],  # part of a run's identity: each test makes its own runs
            "output_dir": str(stack["root"] / "outputs"),
        }
    }


def child_runs(stack: dict[str, Any], parent_id: str) -> list[dict[str, Any]]:
    """The eval-sweep-cell flow runs submitted by the sweep ``parent_id``."""
    runs = rest(
        stack,
        "POST",
        "/flow_runs/filter",
        {"flow_runs": {"parent_flow_run_id": {"any_": [parent_id]}}},
    )
    return list(runs)


def tagged_runs(stack: dict[str, Any], tag: str) -> list[EvalRunRow]:
    engine = get_engine(stack["env"]["VFOPS_DATABASE_URL"])
    with Session(engine) as session:
        return [run for run in session.scalars(select(EvalRunRow)) if tag in (run.tags or [])]


def table_rows(stack: dict[str, Any], flow_run_id: str) -> tuple[list[dict[str, Any]], set[str]]:
    rows, _, keys = sweep_artifacts(stack, flow_run_id)
    return rows, keys


def sweep_artifacts(
    stack: dict[str, Any], flow_run_id: str
) -> tuple[list[dict[str, Any]], str, set[str]]:
    """The sweep's table rows, its markdown report and the keys of all its artifacts."""
    artifacts = rest(
        stack, "POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}}
    )
    found = {a["key"]: a for a in artifacts}
    data = found["eval-sweep-results"]["data"]
    report = str(found.get("eval-sweep-report", {}).get("data", ""))
    return (json.loads(data) if isinstance(data, str) else data), report, set(found)


def running_on(worker: Worker, flow_run_id: str) -> bool:
    """Whether ``worker`` has a flow-run process of ``flow_run_id``."""
    for process in psutil.process_iter():
        try:
            environ = process.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if (
            environ.get("VFOPS_E2E_WORKER") == worker.marker
            and environ.get("PREFECT__FLOW_RUN_ID") == flow_run_id
        ):
            return True
    return False


def test_deploy_registers_the_cell_deployment_and_automations_once(
    fanout: dict[str, Any],
) -> None:
    assert "deployed eval-sweep-cell/eval-sweep-cell" in fanout["deploy_stdout"]
    again = subprocess.run(
        [str(BIN / "vfops"), "deploy", "--work-pool", POOL, "--heartbeat-timeout-s", "50"],
        env=fanout["env"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    automations = rest(fanout, "POST", "/automations/filter", {})
    names = sorted(a["name"] for a in automations)
    assert names == [
        "vfops: crash eval-sweep-cell runs without heartbeats",
        "vfops: reschedule crashed eval-sweep-cell runs",
    ]
    zombie = next(a for a in automations if "heartbeats" in a["name"])
    assert zombie["trigger"]["posture"] == "Proactive"
    assert zombie["trigger"]["within"] == HEARTBEAT_TIMEOUT_S


def test_distributed_sweep_runs_each_cell_on_a_worker(fanout: dict[str, Any]) -> None:
    n, r, tag = 3, 2, "fanout-a"
    workers = [cell_worker(fanout, "cells-a1"), cell_worker(fanout, "cells-a2")]
    started = time.monotonic()
    try:
        # no model call is answered until each worker runs a cell (one at a time each):
        # otherwise a worker that starts first on a busy machine may run all three
        with RequestGate(fanout["stub"]):
            parent = trigger(fanout, distributed_sweep(fanout, n, r, tag), SWEEP_QUEUE)
            deadline = time.monotonic() + 240  # a safety net: the gate makes the state come
            while not all(
                any(running_on(w, c["id"]) for c in child_runs(fanout, parent)) for w in workers
            ):
                assert time.monotonic() < deadline, "the workers never ran a cell each"
                time.sleep(0.5)
        final = wait_for(fanout, parent, timeout_s=300)
        assert final["type"] == "COMPLETED", final["message"]
    finally:
        for worker in workers:
            worker.kill()
    print(f"distributed sweep of 3 cells: {time.monotonic() - started:.1f} s")

    runs = tagged_runs(fanout, tag)
    assert sorted(cell_runs(fanout)[run.id] for run in runs) == [n * r] * 3
    children = child_runs(fanout, parent)
    assert len(children) == 3 and {c["state_type"] for c in children} == {"COMPLETED"}
    used = set()
    for run in runs:
        tags = run.tags or []
        workers_of_run = {t.split(":", 1)[1] for t in tags if t.startswith("worker:")}
        assert len(workers_of_run) == 1, tags
        used |= workers_of_run
        flow_runs = {t.split(":", 1)[1] for t in tags if t.startswith("prefect.flow_run_id:")}
        assert flow_runs <= {c["id"] for c in children} and len(flow_runs) == 1
    assert used == {"cells-a1", "cells-a2"}

    rows, report, keys = sweep_artifacts(fanout, parent)
    assert {"eval-sweep-results", "eval-sweep-report"} <= keys and len(rows) == 3
    # run ids and each cell's flow run: in the report (the table keeps the key columns)
    assert all(f"run `{run.id}`" in report for run in runs)
    assert all(c["id"] in report for c in children) and report.count("flow run") >= 3


@pytest.mark.timeout(900)  # a crash is detected by missed heartbeats (50 s), then rescheduled
def test_lost_worker_cell_is_rescheduled_and_finished_elsewhere(fanout: dict[str, Any]) -> None:
    n, r, tag = 20, 2, "fanout-b"  # 40 calls one at a time: ~6 s of rollouts per cell
    victim, survivor = cell_worker(fanout, "cells-b1"), cell_worker(fanout, "cells-b2")
    started = time.monotonic()
    try:
        # each cell gets 10 of its 40 model calls answered, the rest wait until the kill
        # has landed: the victim's cell stands still mid-cell (it could finish between a
        # look at its progress and the kill on a busy machine)
        with RequestGate(fanout["stub"], allow=10, key=by_temperature):
            parent = trigger(
                fanout, distributed_sweep(fanout, n, r, tag, concurrent=1), SWEEP_QUEUE
            )
            # wait until the victim runs a cell that has rollouts in the registry
            lost: str | None = None
            deadline = time.monotonic() + 240  # a safety net: the gate makes the state come
            while lost is None:
                assert time.monotonic() < deadline, "no cell ran on the victim worker"
                for child in child_runs(fanout, parent):
                    if child["state_type"] == "RUNNING" and running_on(victim, child["id"]):
                        progress = [
                            cell_runs(fanout)[run.id]
                            for run in tagged_runs(fanout, tag)
                            if run.status == "running"
                        ]
                        if any(progress):
                            lost = child["id"]
                time.sleep(0.5)
            victim.kill()  # its process group and its flow-run processes: a lost machine
        killed_at = time.monotonic()
        # crashed once its heartbeats stop, then scheduled again and started elsewhere
        # (the heartbeat timeout, then the automations and a worker's poll: a generous
        # safety net on top, for a busy machine)
        deadline = killed_at + HEARTBEAT_TIMEOUT_S + 240
        lost_run = rest(fanout, "GET", f"/flow_runs/{lost}")
        while lost_run["run_count"] < 2 and time.monotonic() < deadline:
            time.sleep(1)
            lost_run = rest(fanout, "GET", f"/flow_runs/{lost}")
        assert lost_run["run_count"] >= 2, (
            f"the lost worker's cell was not started again ({lost_run['state_type']} "
            f"{time.monotonic() - killed_at:.0f} s after the kill)"
        )
        final = wait_for(fanout, parent, timeout_s=300)
        assert final["type"] == "COMPLETED", final["message"]
    finally:
        victim.kill()
        survivor.kill()
    print(
        f"recovery sweep: {time.monotonic() - started:.1f} s in all, "
        f"{time.monotonic() - killed_at:.1f} s after the kill"
    )

    lost_run = rest(fanout, "GET", f"/flow_runs/{lost}")
    assert lost_run["state_type"] == "COMPLETED"
    assert lost_run["run_count"] >= 2  # started again after the crash
    history = rest(fanout, "GET", f"/flow_run_states/?flow_run_id={lost}")
    assert "CRASHED" in {state["type"] for state in history}

    runs = tagged_runs(fanout, tag)
    assert len(runs) == 3  # one registry run per cell: the lost one was resumed
    engine = get_engine(fanout["env"]["VFOPS_DATABASE_URL"])
    for run in runs:
        keys = [(rec.example_id, rec.rollout_index) for rec in stored_rollouts(engine, run.id)]
        assert len(keys) == len(set(keys)) == n * r
    resumed = next(run for run in runs if f"prefect.flow_run_id:{lost}" in (run.tags or []))
    assert "worker:cells-b2" in (resumed.tags or [])
    rows, _ = table_rows(fanout, parent)
    assert sorted(row["rollouts"] for row in rows) == [n * r] * 3


@pytest.mark.parametrize("pool_type", ["docker", "kubernetes"])
def test_deploy_to_container_pools(fanout: dict[str, Any], pool_type: str) -> None:
    """A docker / kubernetes pool is created when missing (no worker of its type needed),
    used as it is when it exists, and every deployment carries the image. Last in the
    module: deploying moves the deployments (one per name) to that pool."""
    pool = f"vfops-{pool_type}"
    command = [
        str(BIN / "vfops"),
        "deploy",
        "--work-pool",
        pool,
        "--pool-type",
        pool_type,
        "--image",
        "registry.example/vfops:1.0",
    ]
    done = subprocess.run(
        command, env=fanout["env"], capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr
    assert rest(fanout, "GET", f"/work_pools/{pool}")["type"] == pool_type
    # an existing container pool without --image: one line naming the fix
    plain = subprocess.run(
        [str(BIN / "vfops"), "deploy", "--work-pool", pool],
        env=fanout["env"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert plain.returncode != 0
    assert f"is of type {pool_type}" in plain.stderr and "--image" in plain.stderr
    deployments = rest(
        fanout,
        "POST",
        "/deployments/filter",
        {"work_pools": {"name": {"any_": [pool]}}},
    )
    assert {d["name"] for d in deployments} >= {"eval-sweep", "eval-sweep-cell"}
    assert {d["job_variables"].get("image") for d in deployments} == {"registry.example/vfops:1.0"}
