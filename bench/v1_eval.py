"""``vfops eval`` of a verifiers v1 taskset against verifiers 0.4's own ``vf-eval``, on the
same stub endpoint and workload, each as a user runs it: the whole process from start to
exit, defaults on (vfops: registry and MLflow tracking; vf-eval: its in-process runner,
dashboard off, no upload). Run it with .venv-v1's Python (``make setup-v1``)::

    .venv-v1/bin/python bench/v1_eval.py                      # 2,000 rollouts, -c 128, 200 ms
    .venv-v1/bin/python bench/v1_eval.py --vf-eval-rollouts 40

Matched settings: taskset ``v1_arith`` (tests/verifiers_v1_envs), one rollout per task,
128 in flight, a 200 ms stub in a process of its own. vf-eval runs its tool-less ``null``
harness on the ``subprocess`` runtime (the one that needs no container or account) with one
interception server; it launches a program per rollout (~1 rollout/s here), so it runs fewer
rollouts (``--vf-eval-rollouts``) and its rate is compared, not its time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vfops.testing import StubConfig, StubServer

BIN = Path(sys.executable).parent


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} failed: {done.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--vf-eval-rollouts", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--accuracy", type=float, default=0.7)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="v1-bench-"))
    env = {**os.environ, "VFOPS_HOME": str(work / "home"), "STUB_KEY": "stub"}
    config = StubConfig(latency_ms=args.latency_ms)
    with StubServer(config, subprocess=True) as stub:
        taskset = json.dumps({"size": args.rollouts, "accuracy": args.accuracy})
        vfops_s = timed(
            [str(BIN / "vfops"), "eval", "v1_arith", "-m", "stub-model", "-b", stub.base_url,
             "-n", str(args.rollouts), "-r", "1", "-c", str(args.concurrency), "-a", taskset],
            env, work,
        )  # fmt: skip
        n = args.vf_eval_rollouts
        vf_s = timed(
            [str(BIN / "vf-eval"), "v1_arith", "-m", "stub-model",
             "--client.base-url", stub.base_url, "--client.api-key-var", "STUB_KEY",
             "--env.agent.harness.id", "null", "--env.agent.runtime.type", "subprocess",
             "--env.interception.type", "server", "--no-push", "--no-rich",
             "-n", str(n), "-c", str(args.concurrency), "-o", str(work / "vf")],
            env, work,
        )  # fmt: skip
    vfops_rate, vf_rate = args.rollouts / vfops_s, n / vf_s
    print(f"settings: v1_arith, 1 rollout/task, -c {args.concurrency}, "
          f"{args.latency_ms:.0f} ms stub, start to exit")  # fmt: skip
    for name, count, seconds, rate in (
        ("vfops eval", args.rollouts, vfops_s, vfops_rate),
        ("vf-eval", n, vf_s, vf_rate),
    ):
        print(f"{name:<11} {count:>5} rollouts  {seconds:7.1f} s  {rate:7.1f} rollouts/s")
    print(f"ratio (vfops / vf-eval rollouts/s): {vfops_rate / vf_rate:.1f}x")


if __name__ == "__main__":
    main()
