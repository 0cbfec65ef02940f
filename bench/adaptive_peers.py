"""Adaptive concurrency shared across processes: two evals against one capped endpoint.

Two ``vfops eval`` processes, the second ``--stagger-s`` after the first (a worker
joining an endpoint another already fills), run against one stub endpoint (in this
process, on 127.0.0.1) that answers 429 to any chat request arriving while ``--cap``
(X) are being answered; each runs ``--rollouts`` rollouts at ``-c --concurrency``,
with the defaults on (registry: one SQLite file both share; MLflow off). Variants,
interleaved over ``--rounds`` in a shuffled order:

- ``peers``: the default: each process's adaptive limiter shares its 429 pushbacks
  through the registry (``VFOPS_PEER_SYNC_S=0.5``);
- ``alone``: ``VFOPS_PEER_SYNC_S=0``: each process learns the cap on its own.

Per variant: rollouts per second over both processes, from the first start to the
last exit (what a user waiting for both sees), and the share of HTTP requests
answered 429. Prints the ratios peers/alone.

    .venv/bin/python bench/adaptive_peers.py                      # X=24, 100 ms, c=64, 2 x 1500
    .venv/bin/python bench/adaptive_peers.py --cap 16 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vfops.testing import StubConfig, StubServer


def _one(
    base_url: str, folder: Path, sync_s: str, rollouts: int, concurrency: int, stagger_s: float
) -> float:
    env = {
        **os.environ,
        "VFOPS_HOME": str(folder / "home"),
        "VFOPS_DATABASE_URL": f"sqlite:///{folder / 'registry.db'}",
        "VFOPS_TRACKING": "0",
        "VFOPS_PEER_SYNC_S": sync_s,
    }
    argv = [
        sys.executable, "-m", "vfops", "eval", "arithmetic", "-m", "stub-model", "-b", base_url,
        "-n", str(rollouts // 2), "-r", "2", "-c", str(concurrency), "-q",
        "-o", str(folder / "out"),
    ]  # fmt: skip
    started = time.perf_counter()
    processes = []
    for index in range(2):
        if index:
            time.sleep(stagger_s)  # the second joins an endpoint the first already fills
        processes.append(
            subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        )
    for process in processes:
        _, err = process.communicate(timeout=600)
        if process.returncode != 0:
            raise SystemExit(f"vfops eval failed: {err.decode()[-2000:]}")
    return 2 * rollouts / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=int, default=24, help="X: requests in flight the stub takes")
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--concurrency", type=int, default=64, help="-c of each process")
    parser.add_argument("--rollouts", type=int, default=1500, help="rollouts per process")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--stagger-s", type=float, default=3.0, help="seconds before the second process starts"
    )
    args = parser.parse_args()
    variants = {"peers": "0.5", "alone": "0"}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    shares: dict[str, list[tuple[int, int]]] = {name: [] for name in variants}
    print(
        f"stub: 429 above {args.cap} in flight, {args.latency_ms:g} ms; 2 processes x "
        f"{args.rollouts} rollouts at -c {args.concurrency}, the second {args.stagger_s:g} s "
        f"after the first; {args.rounds} rounds"
    )
    config = StubConfig(reply_mode="arithmetic", latency_ms=args.latency_ms, max_in_flight=args.cap)
    with StubServer(config) as stub:
        for round_ in range(args.rounds):
            order = list(variants)
            random.shuffle(order)
            for name in order:
                before = dict(stub.stats)
                with tempfile.TemporaryDirectory() as folder:
                    rate = _one(
                        stub.base_url, Path(folder), variants[name], args.rollouts,
                        args.concurrency, args.stagger_s,
                    )  # fmt: skip
                rejected = stub.stats["429"] - before.get("429", 0)
                answered = stub.stats["requests"] - before.get("requests", 0)
                rates[name].append(rate)
                shares[name].append((rejected, answered))
                print(
                    f"  round {round_ + 1} {name:5s}: {rate:6.1f} rollouts/s, "
                    f"{rejected} of {answered} requests answered 429"
                )
    summary = {}
    for name in variants:
        rejected = sum(r for r, _ in shares[name])
        answered = sum(a for _, a in shares[name])
        summary[name] = (statistics.median(rates[name]), rejected / max(answered, 1))
        rate, share = summary[name]
        print(f"{name:5s}: {rate:6.1f} rollouts/s (median), {share:.2%} of requests answered 429")
    ratio = summary["peers"][0] / summary["alone"][0]
    print(
        f"peers / alone: throughput x{ratio:.3f}, 429 share "
        f"{summary['peers'][1]:.2%} vs {summary['alone'][1]:.2%}"
    )


if __name__ == "__main__":
    main()
