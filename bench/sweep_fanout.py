"""Distributed sweep scheduling latency: the parent's submit to the cell flow's start.

Brings up the local production stack with ``vfops stack up`` (the machine's
PostgreSQL for the registry, Prefect and MLflow; moto's S3; an MLflow server; a
Prefect server; two process workers), registers everything with ``vfops deploy``,
starts a stub model, then runs the same sweep twice through the API:

- ``distribute = true``: each cell is an ``eval-sweep-cell`` flow run; its latency is
  the flow run's ``start_time`` minus its ``created`` time (the parent's
  ``run_deployment``), both Prefect's timestamps. It includes the worker's polling
  interval (``PREFECT_WORKER_QUERY_SECONDS``, Prefect's default 10 s) and the start of
  a flow-run process;
- the baseline, in-process task mode (``distribute = false``): each cell is a
  ``run-cell`` task run of the sweep's flow run; same measure on the task run.

Prints the median and p90 of both (and every cell's figure with ``--verbose``). The
stack is taken down with its databases at the end (``vfops stack down --purge``).

    .venv/bin/python bench/sweep_fanout.py                       # 8 cells, 4 at a time
    .venv/bin/python bench/sweep_fanout.py --cells 4 --query-seconds 2
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vfops.testing import StubConfig, StubServer

BIN = Path(sys.executable).parent


class Api:
    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(
            f"{self.url}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            payload = response.read()
        return json.loads(payload) if payload else None


def _vfops(*args: str, env: dict[str, str], timeout: float = 600) -> str:
    done = subprocess.run(
        [str(BIN / "vfops"), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"vfops {' '.join(args)}: {done.stderr.strip() or done.stdout}")
    return done.stdout


@contextlib.contextmanager
def _stack(root: Path, query_s: float) -> Iterator[tuple[Api, dict[str, str]]]:
    """``vfops stack up`` (PostgreSQL, S3, MLflow, Prefect, two workers polling every
    ``query_s``), ``vfops deploy`` onto it; ``vfops stack down --purge`` after."""
    directory = root / "stack"
    name = f"vfops_bench_{uuid.uuid4().hex[:8]}"
    base = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        _vfops(
            "stack", "up", "--dir", str(directory), "--name", name, "--workers", "2",
            "--service-env", f"worker:PREFECT_WORKER_QUERY_SECONDS={query_s:g}",
            env=base,
        )  # fmt: skip
        env = {k: v for k, v in base.items() if not k.startswith(("AWS_", "MLFLOW_"))}
        for line in _vfops("stack", "env", "--dir", str(directory), env=base).splitlines():
            name_value = shlex.split(line)[1]  # export NAME=VALUE
            key, _, value = name_value.partition("=")
            env[key] = value
        env["VFOPS_HOME"] = str(root / "vfops-home")
        _vfops("deploy", env=env, timeout=300)
        yield Api(env["PREFECT_API_URL"]), env
    finally:
        _vfops("stack", "down", "--dir", str(directory), "--purge", env=base, timeout=300)


def _sweep(endpoints: Path, root: Path, cells: int, distribute: bool) -> dict[str, Any]:
    return {
        "spec": {
            "environments": ["arithmetic"],
            "endpoints": ["stub"],
            "endpoints_file": str(endpoints),
            "sampling": [
                {"name": f"t{i}", "args": {"temperature": round(0.1 * i, 2)}} for i in range(cells)
            ],
            "num_examples": 2,
            "rollouts_per_example": 1,
            "max_parallel_cells": 4,
            "distribute": distribute,
            "tags": [f"bench-{uuid.uuid4().hex[:8]}"],  # new runs: nothing is reused
            "output_dir": str(root / "outputs"),
        }
    }


def _run_sweep(api: Api, parameters: dict[str, Any], timeout_s: float) -> str:
    deployment = api("GET", "/deployments/name/eval-sweep/eval-sweep")
    run = api(
        "POST", f"/deployments/{deployment['id']}/create_flow_run", {"parameters": parameters}
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = api("GET", f"/flow_runs/{run['id']}")["state"] or {}
        if state.get("type") in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}:
            if state["type"] != "COMPLETED":
                raise RuntimeError(f"sweep {run['id']} ended {state['type']}: {state['message']}")
            return str(run["id"])
        time.sleep(1)
    raise RuntimeError(f"sweep {run['id']} did not finish in {timeout_s:g} s")


def _ts(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def _latencies(rows: list[dict[str, Any]]) -> list[float]:
    return [
        (_ts(row["start_time"]) - _ts(row["created"])).total_seconds()
        for row in rows
        if row.get("start_time")
    ]


def _distributed_latencies(api: Api, parent: str) -> list[float]:
    children = api(
        "POST", "/flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [parent]}}}
    )
    return _latencies(children)


def _task_latencies(api: Api, parent: str) -> list[float]:
    tasks = api("POST", "/task_runs/filter", {"task_runs": {"flow_run_id": {"any_": [parent]}}})
    # run-cell task runs are named after their cell (env / endpoint / sampling)
    return _latencies([t for t in tasks if " / " in t["name"]])


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def _report(label: str, values: list[float], verbose: bool) -> None:
    print(
        f"{label:<34} n={len(values):<3} median {statistics.median(values):6.2f} s   "
        f"p90 {_p90(values):6.2f} s   max {max(values):6.2f} s"
    )
    if verbose:
        print("    " + " ".join(f"{v:.2f}" for v in sorted(values)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cells", type=int, default=8, help="cells per sweep (default 8)")
    parser.add_argument(
        "--query-seconds",
        type=float,
        default=10.0,
        help="PREFECT_WORKER_QUERY_SECONDS of the workers (Prefect's default: 10)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per sweep")
    parser.add_argument("--verbose", action="store_true", help="every cell's latency")
    parser.add_argument("--keep", action="store_true", help="keep the logs folder")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-fanout-"))
    with StubServer(StubConfig(reply_mode="arithmetic", latency_ms=20)) as stub:
        endpoints = root / "endpoints.toml"
        endpoints.write_text(
            f'[[endpoint]]\nalias = "stub"\nmodel = "stub-model"\nbase_url = "{stub.base_url}"\n'
        )
        with _stack(root, args.query_seconds) as (api, _env):
            wall = time.monotonic()
            parent = _run_sweep(api, _sweep(endpoints, root, args.cells, True), args.timeout)
            distributed_wall = time.monotonic() - wall
            wall = time.monotonic()
            baseline = _run_sweep(api, _sweep(endpoints, root, args.cells, False), args.timeout)
            task_wall = time.monotonic() - wall
            distributed = _distributed_latencies(api, parent)
            tasks = _task_latencies(api, baseline)
    print(
        f"{args.cells} cells (N=2, R=1), 4 at a time, on vfops stack (PostgreSQL registry and "
        f"Prefect, MLflow server, S3), 2 process workers, "
        f"PREFECT_WORKER_QUERY_SECONDS={args.query_seconds:g}"
    )
    print("scheduling latency: submit -> start, from Prefect's run timestamps")
    _report("distributed (eval-sweep-cell runs)", distributed, args.verbose)
    _report("in-process tasks (run-cell)", tasks, args.verbose)
    print(f"sweep wall time: distributed {distributed_wall:.1f} s, tasks {task_wall:.1f} s")
    if args.keep:
        print(f"logs: {root}")


if __name__ == "__main__":
    main()
