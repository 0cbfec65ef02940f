"""Distributed sweep cells on ``vfops stack``: submit-to-start latency, and a sweep's wall time.

Brings up the local production stack with ``vfops stack up`` (the machine's
PostgreSQL for the registry, Prefect and MLflow; moto's S3; an MLflow server; a
Prefect server; process workers, with the stack's default settings unless
``--launcher``, ``--query-seconds`` or ``--service-env`` change them), registers
everything with ``vfops deploy``, starts a stub model, then, by ``--mode``:

- ``compare`` (default): the same sweep twice through the ``eval-sweep`` deployment,
  ``distribute = true`` (each cell an ``eval-sweep-cell`` flow run) and the in-process
  task mode; each cell's latency is its run's ``start_time`` minus its ``created``
  time, both Prefect's timestamps;
- ``latency``: ``--runs`` cell flow runs submitted one after the other to an idle
  worker (one worker, nothing else queued); per run, from Prefect's state history:
  submit (``created``) -> Pending (a worker took it: the polling) -> Running (the
  flow-run process started and loaded the flow) = submit-to-start; ``--launcher all``
  takes turns between the stack's engine entry, plain ``python -m prefect.engine`` and
  Prefect's workspace supervisor on one stack;
- ``sweep``: one sweep of ``--cells`` cells over ``--workers`` workers, each running
  one cell at a time (``--worker-limit 1``), the sweep's own flow run started from
  this machine's shell (not on a worker, so every worker slot is a cell's). Each cell
  is a real evaluation against the stub model (``--calls`` model calls of
  ``--latency-ms``, 2 at a time); its time is its flow run's ``end_time`` minus
  ``start_time``. Checks the wall time against
  ``1.25 x (sum of cell times / workers) + start-up``, start-up being the time from
  the sweep's start to its first cell's start;
- ``idle``: the CPU the Prefect server and the workers spend while idle workers poll;
- ``background``: Prefect's background tasks (a task worker, ``task.delay()`` of a
  trivial task), submit -> Running, for comparison.

Prints median and p90 (and every figure with ``--verbose``) and the machine's load
average before and after. The stack is taken down with its databases at the end
(``vfops stack down --purge``).

    .venv/bin/python bench/sweep_fanout.py                                   # compare, 8 cells
    .venv/bin/python bench/sweep_fanout.py --mode latency --runs 20
    .venv/bin/python bench/sweep_fanout.py --mode sweep --cells 100 --workers 4
    .venv/bin/python bench/sweep_fanout.py --mode latency --runs 20 \\
        --launcher workspace --query-seconds 10          # Prefect's own settings
    .venv/bin/python bench/sweep_fanout.py --mode idle --workers 4 --query-seconds 1
    .venv/bin/python bench/sweep_fanout.py --mode background --runs 20
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import random
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
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


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


_COMMANDS: dict[str, str | None] = {
    "engine": None,  # the pool's own command
    "prefect-engine": shlex.join([sys.executable, "-m", "prefect.engine"]),
    "workspace": "",  # no command: Prefect's workspace supervisor
}
"""``--launcher all``: each launcher as the ``command`` job variable of a flow run."""


def _settings(args: argparse.Namespace) -> list[str]:
    """The ``vfops stack up`` flags of the worker settings under test."""
    launcher = "workspace" if args.launcher == "workspace" else "engine"
    flags = ["--flow-run-launcher", launcher]
    if args.query_seconds is not None:
        flags += ["--service-env", f"worker:PREFECT_WORKER_QUERY_SECONDS={args.query_seconds:g}"]
    for item in args.service_env:
        flags += ["--service-env", item]
    return flags


def _describe(args: argparse.Namespace) -> str:
    query = "the stack's" if args.query_seconds is None else f"{args.query_seconds:g} s"
    extra = f", {' '.join(args.service_env)}" if args.service_env else ""
    return f"launcher {args.launcher}, worker polling {query}{extra}"


@contextlib.contextmanager
def _stack(
    root: Path, args: argparse.Namespace, workers: int, worker_limit: int | None
) -> Iterator[tuple[Api, dict[str, str]]]:
    """``vfops stack up`` (PostgreSQL, S3, MLflow, Prefect, ``workers`` workers),
    ``vfops deploy`` onto it; ``vfops stack down --purge`` after."""
    directory = root / "stack"
    name = f"vfops_bench_{uuid.uuid4().hex[:8]}"
    base = {**os.environ, "PYTHONUNBUFFERED": "1"}
    up = ["stack", "up", "--dir", str(directory), "--name", name, "--workers", str(workers)]
    if worker_limit is not None:
        up += ["--worker-limit", str(worker_limit)]
    up += _settings(args)
    try:
        _vfops(*up, env=base)
        env = {k: v for k, v in base.items() if not k.startswith(("AWS_", "MLFLOW_"))}
        for line in _vfops("stack", "env", "--dir", str(directory), env=base).splitlines():
            name_value = shlex.split(line)[1]  # export NAME=VALUE
            key, _, value = name_value.partition("=")
            env[key] = value
        env["VFOPS_HOME"] = str(root / "vfops-home")
        _vfops("deploy", env=env, timeout=300)
        api = Api(env["PREFECT_API_URL"])
        if args.launcher == "prefect-engine":
            cell = api("GET", "/deployments/name/eval-sweep-cell/eval-sweep-cell")
            command = {"command": _COMMANDS["prefect-engine"]}
            api("PATCH", f"/deployments/{cell['id']}", {"job_variables": command})
        yield api, env
    finally:
        _vfops("stack", "down", "--dir", str(directory), "--purge", env=base, timeout=300)


# ---------------------------------------------------------------- timestamps


def _ts(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def _seconds(later: str, earlier: str) -> float:
    return (_ts(later) - _ts(earlier)).total_seconds()


def _latencies(rows: list[dict[str, Any]]) -> list[float]:
    return [_seconds(row["start_time"], row["created"]) for row in rows if row.get("start_time")]


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def _report(label: str, values: list[float], verbose: bool) -> None:
    print(
        f"{label:<36} n={len(values):<3} median {statistics.median(values):6.2f} s   "
        f"p90 {_p90(values):6.2f} s   max {max(values):6.2f} s"
    )
    if verbose:
        print("    " + " ".join(f"{v:.2f}" for v in sorted(values)))


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


# ---------------------------------------------------------------- runs


def _wait_final(api: Api, run_id: str, timeout_s: float, poll_s: float = 0.2) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run: dict[str, Any] = api("GET", f"/flow_runs/{run_id}")
        state = run["state"] or {}
        if state.get("type") in FINAL:
            if state["type"] != "COMPLETED":
                raise RuntimeError(f"flow run {run_id} ended {state['type']}: {state['message']}")
            return run
        time.sleep(poll_s)
    raise RuntimeError(f"flow run {run_id} did not finish in {timeout_s:g} s")


def _stub_endpoints(root: Path, stub: StubServer) -> Path:
    endpoints = root / "endpoints.toml"
    endpoints.write_text(
        f'[[endpoint]]\nalias = "stub"\nmodel = "stub-model"\nbase_url = "{stub.base_url}"\n'
    )
    return endpoints


def _sweep_spec(
    endpoints: Path, root: Path, cells: int, distribute: bool, *, parallel: int, calls: int
) -> dict[str, Any]:
    return {
        "environments": ["arithmetic"],
        "endpoints": ["stub"],
        "endpoints_file": str(endpoints),
        "sampling": [
            {"name": f"t{i}", "args": {"temperature": round(0.01 * i, 2)}} for i in range(cells)
        ],
        "num_examples": calls,
        "rollouts_per_example": 1,
        "max_concurrent": 2,
        "max_parallel_cells": parallel,
        "distribute": distribute,
        "tags": [f"bench-{uuid.uuid4().hex[:8]}"],  # new runs: nothing is reused
        "output_dir": str(root / "outputs"),
    }


def _run_sweep(api: Api, spec: dict[str, Any], timeout_s: float) -> str:
    deployment = api("GET", "/deployments/name/eval-sweep/eval-sweep")
    run = api(
        "POST", f"/deployments/{deployment['id']}/create_flow_run", {"parameters": {"spec": spec}}
    )
    _wait_final(api, str(run["id"]), timeout_s, poll_s=1.0)
    return str(run["id"])


def _children(api: Api, parent: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    while True:  # the API returns at most 200 per call
        page = api(
            "POST",
            "/flow_runs/filter",
            {
                "flow_runs": {"parent_flow_run_id": {"any_": [parent]}},
                "offset": len(found),
                "limit": 200,
            },
        )
        found += page
        if len(page) < 200:
            return found


# ---------------------------------------------------------------- modes


def compare(args: argparse.Namespace, root: Path, stub: StubServer) -> None:
    endpoints = _stub_endpoints(root, stub)
    with _stack(root, args, 2, None) as (api, _env):
        wall = time.monotonic()
        spec = _sweep_spec(endpoints, root, args.cells, True, parallel=4, calls=2)
        parent = _run_sweep(api, spec, args.timeout)
        distributed_wall = time.monotonic() - wall
        wall = time.monotonic()
        spec = _sweep_spec(endpoints, root, args.cells, False, parallel=4, calls=2)
        baseline = _run_sweep(api, spec, args.timeout)
        task_wall = time.monotonic() - wall
        distributed = _latencies(_children(api, parent))
        tasks = api(
            "POST", "/task_runs/filter", {"task_runs": {"flow_run_id": {"any_": [baseline]}}}
        )
        # run-cell task runs are named after their cell (env / endpoint / sampling)
        in_process = _latencies([t for t in tasks if " / " in t["name"]])
    print(f"{args.cells} cells (N=2, R=1), 4 at a time, on vfops stack, 2 process workers")
    print("scheduling latency: submit -> start, from Prefect's run timestamps")
    _report("distributed (eval-sweep-cell runs)", distributed, args.verbose)
    _report("in-process tasks (run-cell)", in_process, args.verbose)
    print(f"sweep wall time: distributed {distributed_wall:.1f} s, tasks {task_wall:.1f} s")


def _cell_parameters(endpoints: Path, root: Path, index: int, tag: str) -> dict[str, Any]:
    """An ``eval-sweep-cell`` flow run's parameters: one cell of 1 example x 1 rollout."""
    return {
        "cell": {
            "env_ref": "arithmetic",
            "env_name": "arithmetic",
            "ref_kind": "installed",
            "endpoint": "stub",
            "endpoints_file": str(endpoints),
            "sampling": {"name": f"t{index}", "args": {"temperature": round(0.01 * index, 2)}},
            "num_examples": 1,
            "rollouts_per_example": 1,
            "max_concurrent": 1,
            "tags": [tag],
        },
        "output_dir": str(root / "outputs"),
    }


def _state_times(api: Api, run_id: str) -> dict[str, str]:
    """The first time the run entered each state type (its state history)."""
    states = api("GET", f"/flow_run_states/?flow_run_id={run_id}")
    found: dict[str, str] = {}
    for state in sorted(states, key=lambda s: _ts(s["timestamp"])):
        found.setdefault(state["type"], state["timestamp"])
    return found


def latency(args: argparse.Namespace, root: Path, stub: StubServer) -> None:
    """Cell flow runs one after the other on one idle worker. With ``--launcher all``
    the runs take turns on one stack, so all see the same machine load: ``engine`` (the
    pool's command, vfops' engine entry), ``prefect-engine`` (a ``command`` job variable
    of plain ``python -m prefect.engine``), ``workspace`` (an empty ``command`` job
    variable, which gives Prefect's workspace supervisor)."""
    endpoints = _stub_endpoints(root, stub)
    tag = f"bench-{uuid.uuid4().hex[:8]}"
    launchers = list(_COMMANDS) if args.launcher == "all" else [args.launcher]
    figures: dict[str, dict[str, list[float]]] = {
        launcher: {"picked": [], "started": [], "total": []} for launcher in launchers
    }
    with _stack(root, args, 1, 1) as (api, _env):
        deployment = api("GET", "/deployments/name/eval-sweep-cell/eval-sweep-cell")
        load_before = _load()
        rng = random.Random(0)
        for index in range(args.runs * len(launchers)):
            launcher = launchers[index % len(launchers)]
            body: dict[str, Any] = {"parameters": _cell_parameters(endpoints, root, index, tag)}
            if launcher in _COMMANDS and _COMMANDS[launcher] is not None:
                body["job_variables"] = {"command": _COMMANDS[launcher]}
            # an idle worker: the previous run has ended; a random pause so that
            # submissions fall anywhere in the worker's polling cycle
            time.sleep(rng.uniform(0.0, 2.0))
            run = api("POST", f"/deployments/{deployment['id']}/create_flow_run", body)
            done = _wait_final(api, str(run["id"]), args.timeout)
            times = _state_times(api, str(run["id"]))
            found = figures[launcher]
            found["picked"].append(_seconds(times["PENDING"], done["created"]))
            found["started"].append(_seconds(done["start_time"], times["PENDING"]))
            found["total"].append(_seconds(done["start_time"], done["created"]))
            if args.verbose:
                print(
                    f"  run {index + 1} ({launcher}): taken {found['picked'][-1]:.2f} s, "
                    f"process {found['started'][-1]:.2f} s, submit->start "
                    f"{found['total'][-1]:.2f} s",
                    flush=True,
                )
        load_after = _load()
    print(
        f"{args.runs} eval-sweep-cell flow runs per launcher, one at a time, on an idle "
        "worker of vfops stack"
    )
    print(f"worker settings: {_describe(args)}")
    print(f"load average before {load_before}, after {load_after} ({os.cpu_count()} cores)")
    for launcher, found in figures.items():
        print(f"launcher {launcher}:")
        _report("  submit -> Pending (worker took it)", found["picked"], args.verbose)
        _report("  Pending -> Running (process start)", found["started"], args.verbose)
        _report("  submit -> start", found["total"], args.verbose)


_PROBE_TASK = """
from prefect import task


@task(name="bench-probe")
def probe(index: int) -> int:
    return index
"""

_TASK_WORKER = """
from prefect.task_worker import serve
from bench_probe import probe
serve(probe)
"""

_DELAY = """
import json, random, sys, time, uuid
from prefect.client.orchestration import get_client
from bench_probe import probe

rng = random.Random(0)
with get_client(sync_client=True) as client:
    for index in range(int(sys.argv[1])):
        time.sleep(rng.uniform(0.0, 2.0))
        future = probe.delay(index)
        future.wait(timeout=120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # task-run states reach the database as events
            states = client.read_task_run_states(future.task_run_id)
            running = [s.timestamp for s in states if s.type.value == "RUNNING"]
            if running and any(s.type.value == "COMPLETED" for s in states):
                break
            time.sleep(0.2)
        run = client.read_task_run(future.task_run_id)
        print(json.dumps({"created": run.created.isoformat(), "start": min(running).isoformat()}))
"""


def background(args: argparse.Namespace, root: Path, stub: StubServer) -> None:
    """Prefect's background tasks: a warm task worker (``prefect.task_worker.serve``, as
    ``prefect task serve`` runs it) pushed each ``task.delay()`` over a websocket."""
    (root / "bench_probe.py").write_text(_PROBE_TASK)
    with _stack(root, args, 0, None) as (_api, env):
        env = {**env, "PYTHONPATH": os.pathsep.join([str(root), env.get("PYTHONPATH", "")])}
        log = (root / "task-worker.log").open("w")
        worker = subprocess.Popen(
            [sys.executable, "-c", _TASK_WORKER], env=env, stdout=log, stderr=log, cwd=root
        )
        try:
            time.sleep(10)  # the worker subscribes (no readiness signal to wait on)
            load_before = _load()
            done = subprocess.run(
                [sys.executable, "-c", _DELAY, str(args.runs)],
                env=env, capture_output=True, text=True, timeout=args.timeout, check=False,
                cwd=root,
            )  # fmt: skip
            load_after = _load()
        finally:
            worker.terminate()
            worker.wait(timeout=30)
            log.close()
        if done.returncode != 0:
            raise RuntimeError(f"background tasks failed: {done.stderr[-3000:]}")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    values = [_seconds(row["start"], row["created"]) for row in rows]
    print(f"{len(rows)} background tasks (task.delay()), one at a time, on a warm task worker")
    print(f"load average before {load_before}, after {load_after} ({os.cpu_count()} cores)")
    _report("submit -> start", values, args.verbose)


def idle(args: argparse.Namespace, root: Path, stub: StubServer) -> None:
    """What polling costs: CPU of the Prefect server and of the workers while
    ``--workers`` idle workers poll, over ``--idle-seconds``."""
    import psutil

    with _stack(root, args, args.workers, 1) as (_api, _env):
        state = json.loads((root / "stack" / "stack.json").read_text())
        groups = {
            "prefect server": [state["services"]["prefect"]["pid"]],
            "workers": [s["pid"] for s in state["services"].values() if s["kind"] == "worker"],
        }
        time.sleep(10)  # past the workers' start-up

        def cpu(pids: list[int]) -> float:
            total = 0.0
            for pid in pids:
                process = psutil.Process(pid)
                for p in [process, *process.children(recursive=True)]:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        times = p.cpu_times()
                        total += times.user + times.system
            return total

        before = {name: cpu(pids) for name, pids in groups.items()}
        load_before = _load()
        time.sleep(args.idle_seconds)
        used = {name: cpu(pids) - before[name] for name, pids in groups.items()}
        load_after = _load()
    print(f"{args.workers} idle workers, {_describe(args)}, over {args.idle_seconds:g} s")
    print(f"load average before {load_before}, after {load_after} ({os.cpu_count()} cores)")
    for name, seconds in used.items():
        print(f"{name:<16} {100 * seconds / args.idle_seconds:5.1f} % of a core")


_LOCAL_SWEEP = """
import json, sys
from vfops.flows.eval_sweep import eval_sweep
from vfops.sweeps import SweepSpec
eval_sweep(SweepSpec.model_validate(json.loads(sys.argv[1])))
"""


def _machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (every core, every user: /proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _service_cpu_s(state: dict[str, Any]) -> dict[str, float]:
    """CPU seconds of the stack's services so far: the Prefect and MLflow servers with
    their processes, the workers, and the flow runs the workers have started and
    waited for (a process's ``children_*`` times)."""
    import psutil

    found = {"prefect server": 0.0, "mlflow server": 0.0, "workers": 0.0, "flow runs": 0.0}
    for service in state["services"].values():
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(service["pid"])
            times = process.cpu_times()
            if service["kind"] == "worker":
                found["workers"] += times.user + times.system
                found["flow runs"] += times.children_user + times.children_system
            elif service["kind"] in {"prefect", "mlflow"}:
                own = times.user + times.system + times.children_user + times.children_system
                for child in process.children(recursive=True):
                    with contextlib.suppress(psutil.NoSuchProcess):
                        child_times = child.cpu_times()
                        own += child_times.user + child_times.system
                found[f"{service['kind']} server"] += own
    return found


def sweep(args: argparse.Namespace, root: Path, stub: StubServer) -> None:
    endpoints = _stub_endpoints(root, stub)
    with _stack(root, args, args.workers, 1) as (api, env):
        # the pool's capacity (workers x 1) is the limit; twice as many cells submitted
        # means a worker that finishes a cell finds the next one queued, not submitted
        # only when the sweep's own flow run next looks (every 2 s)
        parallel = args.parallel or 2 * args.workers
        spec = _sweep_spec(endpoints, root, args.cells, True, parallel=parallel, calls=args.calls)
        state = json.loads((root / "stack" / "stack.json").read_text())
        load_before, cpu_before, busy_before = _load(), _service_cpu_s(state), _machine_busy_s()
        begun = time.time()
        done = subprocess.run(
            [sys.executable, "-c", _LOCAL_SWEEP, json.dumps(spec)],
            env=env, capture_output=True, text=True, timeout=args.timeout, check=False,
        )  # fmt: skip
        ended = time.time()
        load_after, cpu_after, busy_after = _load(), _service_cpu_s(state), _machine_busy_s()
        if done.returncode != 0:
            raise RuntimeError(f"the sweep failed: {done.stderr[-3000:]}")
        cells = _cell_runs(api)
    if len(cells) != args.cells:
        raise RuntimeError(f"{len(cells)} cell runs, not {args.cells}")
    durations = [_seconds(c["end_time"], c["start_time"]) for c in cells]
    starts = sorted(_ts(c["start_time"]).timestamp() for c in cells)
    ends = sorted(_ts(c["end_time"]).timestamp() for c in cells)
    # a worker's slot freed by the i-th cell to end is taken by the (i + workers)-th to start
    gaps = [start - end for start, end in zip(starts[args.workers :], ends, strict=False)]
    start_up = starts[0] - begun
    wall = ended - begun
    bound = 1.25 * sum(durations) / args.workers + start_up
    print(
        f"{args.cells}-cell distributed sweep over {args.workers} workers (1 cell at a time "
        f"each) on vfops stack, max_parallel_cells {parallel}; each cell {args.calls} model "
        f"calls of {args.latency_ms} ms, 2 at a time"
    )
    print(f"worker settings: {_describe(args)}")
    print(f"load average before {load_before}, after {load_after} ({os.cpu_count()} cores)")
    busy = busy_after - busy_before
    used = ", ".join(f"{k} {cpu_after[k] - cpu_before[k]:.0f} s" for k in cpu_after)
    print(
        f"CPU during the sweep: machine {busy:.0f} s of {wall * (os.cpu_count() or 1):.0f} s "
        f"({100 * busy / (wall * (os.cpu_count() or 1)):.0f} % busy, every user); {used}"
    )
    _report("cell time (start -> end)", durations, args.verbose)
    _report("cell submit -> start", _latencies(cells), args.verbose)
    _report("a cell's end -> next start", gaps, args.verbose)
    print(
        f"sum of cell times {sum(durations):.1f} s; / {args.workers} = "
        f"{sum(durations) / args.workers:.1f} s; start-up (sweep start -> first cell start) "
        f"{start_up:.1f} s; last cell end -> sweep end {ended - ends[-1]:.1f} s"
    )
    verdict = "within" if wall <= bound else "OVER"
    print(
        f"wall {wall:.1f} s, bound 1.25 x {sum(durations) / args.workers:.1f} + "
        f"{start_up:.1f} = {bound:.1f} s: {verdict} ({wall / bound:.2f} of the bound)"
    )


def _cell_runs(api: Api) -> list[dict[str, Any]]:
    deployment = api("GET", "/deployments/name/eval-sweep-cell/eval-sweep-cell")
    found: list[dict[str, Any]] = []
    while True:
        page = api(
            "POST",
            "/flow_runs/filter",
            {
                "deployments": {"id": {"any_": [deployment["id"]]}},
                "offset": len(found),
                "limit": 200,
            },
        )
        found += page
        if len(page) < 200:
            return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--mode", choices=("compare", "latency", "sweep", "background", "idle"), default="compare"
    )
    parser.add_argument("--cells", type=int, default=8, help="cells per sweep (default 8)")
    parser.add_argument("--runs", type=int, default=20, help="latency: flow runs (default 20)")
    parser.add_argument("--workers", type=int, default=4, help="sweep: workers (default 4)")
    parser.add_argument(
        "--calls", type=int, default=30, help="sweep: model calls per cell (default 30)"
    )
    parser.add_argument(
        "--latency-ms", type=int, default=800, help="sweep: per model call (default 800)"
    )
    parser.add_argument(
        "--service-env",
        action="append",
        default=[],
        metavar="SERVICE:NAME=VALUE",
        help="passed to vfops stack up (e.g. worker:PREFECT_WORKER_PREFETCH_SECONDS=0)",
    )
    parser.add_argument(
        "--launcher",
        choices=("engine", "workspace", "prefect-engine", "all"),
        default="engine",
        help="vfops stack up --flow-run-launcher (default: engine, the stack's default); "
        "prefect-engine: plain python -m prefect.engine as the cell deployment's command; "
        "latency: all takes turns with the three on one stack",
    )
    parser.add_argument(
        "--query-seconds",
        type=float,
        default=None,
        help="the workers' PREFECT_WORKER_QUERY_SECONDS (default: the stack's)",
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=None,
        help="sweep: the sweep's max_parallel_cells (default: 2 x --workers, so that a "
        "worker that frees finds the next cell queued)",
    )
    parser.add_argument(
        "--idle-seconds", type=float, default=60.0, help="idle: seconds measured (default 60)"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per sweep")
    parser.add_argument("--verbose", action="store_true", help="every figure")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-fanout-"))
    latency_ms = args.latency_ms if args.mode == "sweep" else 20
    with StubServer(StubConfig(reply_mode="arithmetic", latency_ms=latency_ms)) as stub:
        modes = {
            "compare": compare,
            "latency": latency,
            "sweep": sweep,
            "background": background,
            "idle": idle,
        }
        modes[args.mode](args, root, stub)


if __name__ == "__main__":
    main()
