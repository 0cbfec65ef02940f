"""What logging an eval run's rollouts as MLflow traces costs the tracker.

The tracker process (``python -m vfops.tracking._tracker_main``) logs a finished run
(params, metrics, the ``rollouts.parquet`` artifact), answers the evaluation, then
logs the rollouts as traces (:mod:`vfops.tracking._traces`). This runs the same two
steps in-process on one synthetic run of N rollouts (two-turn tool-calling rollouts,
20 % failing) and reports, against the run-only baseline measured in the same
invocation, the time of the traces at the default share (``VFOPS_TRACE_ROLLOUTS``
unset: every failure and 1,000 passing rollouts) and of all rollouts.

    .venv/bin/python bench/trace_overhead.py                 # embedded store and a server
    .venv/bin/python bench/trace_overhead.py --only embedded -n 2000
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from vfops._net import free_port
from vfops._rollout import RolloutRecord, Timing, TokenUsage


def _record(example_id: int, rollout_index: int) -> RolloutRecord:
    failing = (example_id * 2 + rollout_index) % 5 == 0  # 20 %
    call = {"id": f"call_{example_id}", "type": "function",
            "function": {"name": "calculate", "arguments": '{"expression": "6 * 7"}'}}  # fmt: skip
    return RolloutRecord(
        example_id=example_id,
        rollout_index=rollout_index,
        prompt=[
            {"role": "system", "content": "Use the calculate tool, then answer in <answer> tags."},
            {"role": "user", "content": f"Problem {example_id}: what is 6 * 7 plus nothing?"},
        ],
        completion=[
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "42", "tool_call_id": call["id"]},
            {
                "role": "assistant",
                "content": "<answer>41</answer>" if failing else "<answer>42</answer>",
            },
        ],
        answer="42",
        reward=0.1 if failing else 1.1,
        metrics={"correct_answer": 0.0 if failing else 1.0, "used_calculator": 1.0},
        timing=Timing(generation_ms=250.0, scoring_ms=0.5),
        usage=TokenUsage(prompt_tokens=60, completion_tokens=20),
        turns=2,
        model="bench-model",
    )


def _registry_run(engine: Any, examples: int, rollouts: int) -> str:
    from vfops.registry import NewRun, create_run, finish_run, insert_rollouts, session_scope

    with session_scope(engine) as session:
        new = NewRun(
            environment_name="calculator", environment_version="0.1.0",
            environment_content_hash="ab" * 32, model="bench-model",
            base_url="http://127.0.0.1:9/v1", sampling_args={}, env_args={},
            num_examples=examples, rollouts_per_example=rollouts,
            config_fingerprint=os.urandom(32).hex(),
        )  # fmt: skip
        run = create_run(session, new)
        run_id = run.id
    with session_scope(engine) as session:
        records = [_record(e, r) for e in range(examples) for r in range(rollouts)]
        insert_rollouts(session, run_id, records)
        finish_run(session, run_id, "completed", {"pass_threshold": 1.0, "wall_s": 10.0})
    return run_id


def _measure(engine: Any, examples: int, rollouts: int, share: str | None) -> dict[str, float]:
    """Seconds for the run alone, then for its traces (``share``: VFOPS_TRACE_ROLLOUTS)."""
    from vfops.tracking import prepare_run_log
    from vfops.tracking._eval_runs import log_run_deferring_traces

    if share is None:
        os.environ.pop("VFOPS_TRACE_ROLLOUTS", None)
    else:
        os.environ["VFOPS_TRACE_ROLLOUTS"] = share
    run_id = _registry_run(engine, examples, rollouts)
    with tempfile.TemporaryDirectory(prefix="vfops-bench-") as folder:
        info, rollouts_file = prepare_run_log(engine, run_id, Path(folder))
        started = time.perf_counter()
        _, traces = log_run_deferring_traces(info, rollouts_file=rollouts_file)
        run_s = time.perf_counter() - started
    started = time.perf_counter()
    logged = traces.log() if traces is not None else 0
    return {"run_s": run_s, "traces_s": time.perf_counter() - started, "traces": logged}


def _start_server(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
         "--port", str(port), "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
         "--artifacts-destination", str(folder / "artifacts"), "--workers", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.3)
    os.killpg(process.pid, signal.SIGKILL)
    raise SystemExit("mlflow server did not start in 90 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--rollouts", type=int, default=2000)
    parser.add_argument("--only", choices=["embedded", "server"], default=None)
    args = parser.parse_args()
    examples, per_example = args.rollouts // 2, 2
    root = Path(tempfile.mkdtemp(prefix="vfops-trace-bench-"))
    os.environ["VFOPS_HOME"] = str(root / "home")
    from vfops.registry import get_engine

    engine = get_engine(f"sqlite:///{root / 'registry.db'}")
    stores = [args.only] if args.only else ["embedded", "server"]
    try:
        for store in stores:
            server = None
            if store == "server":
                server, url = _start_server(root / "server")
                os.environ["MLFLOW_TRACKING_URI"] = url
            else:
                os.environ.pop("MLFLOW_TRACKING_URI", None)
            try:
                _measure(engine, 1, 1, None)  # warm-up: imports, store creation
                default_share = _measure(engine, examples, per_example, None)
                every_rollout = _measure(engine, examples, per_example, "all")
                rows = [("default share", default_share), ("all rollouts", every_rollout)]
            finally:
                if server is not None:
                    os.killpg(server.pid, signal.SIGTERM)
                    server.wait(30)
            print(f"\n{store} store, {examples * per_example} rollouts (2 turns, 1 tool call):")
            for label, row in rows:
                per = 1000 * row["traces_s"] / max(row["traces"], 1)
                print(
                    f"  {label:14s} run {row['run_s']:6.2f} s | traces {int(row['traces']):5d} "
                    f"in {row['traces_s']:6.2f} s ({per:.1f} ms each) | tracker total "
                    f"{(row['run_s'] + row['traces_s']) / row['run_s']:5.1f}x the run alone"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
