"""Adaptive concurrency against an endpoint with an unknown cap on requests in flight.

The stub server (``vfops.testing.StubServer``, in a subprocess, on 127.0.0.1) answers
429 (``Retry-After: 0.05``) to any chat request arriving while ``--cap`` (X) are
already being answered, and answers the others after ``--latency-ms``. The client
(:class:`vfops.clients.OpenAIClient`, default retry policy: 429s with a
``Retry-After`` are waited out and retried) sends ``--requests`` (N) chat requests
from ``--concurrency`` (C) concurrent workers, far more than X, through:

- ``fixed-K``: a :class:`vfops.budget.LocalRequestLimiter` of ``max_concurrent=K``
  for each K of ``--fixed`` (a sweep around X: what a user who knew X would set);
- ``adaptive``: a fresh :class:`vfops.budget.AdaptiveLimiter()` each run (X is not
  told; its discovery of X, the first burst of C requests of which C - X get 429,
  is counted in every adaptive run).

Settings run one after another, interleaved over ``--rounds`` (each round runs
every setting once, in a shuffled order), against one stub. Per setting: requests
per second (N / wall time, median over rounds) and the 429 share (429 answers /
HTTP requests the stub answered, summed over rounds). The bar (issue 16 part 3):
adaptive reaches >= 85 % of the best fixed setting's throughput with <= 2 % of its
requests answered 429. Exits 0 either way and prints PASS/FAIL.

    .venv/bin/python bench/adaptive_concurrency.py                 # X=24, 100 ms, C=128, N=10000
    .venv/bin/python bench/adaptive_concurrency.py --cap 24 --latency-ms 200 --requests 4000
    .venv/bin/python bench/adaptive_concurrency.py --quick         # smoke run (~30 s)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from typing import Any

from vfops.budget import AdaptiveLimiter, LocalRequestLimiter, RequestLimiter
from vfops.clients import OpenAIClient
from vfops.testing import StubConfig, StubServer

MESSAGES = [{"role": "user", "content": "What is 123 + 456?"}]
THROUGHPUT_BAR = 0.85
SHARE_429_BAR = 0.02


async def _drive(base_url: str, limiter: RequestLimiter, n: int, concurrency: int) -> float:
    async with OpenAIClient(base_url, limiter=limiter) as client:
        remaining = n

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await client.chat(model="stub-model", messages=MESSAGES)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - start


def _limiter(setting: str) -> RequestLimiter:
    if setting == "adaptive":
        return AdaptiveLimiter()
    return LocalRequestLimiter(max_concurrent=int(setting.removeprefix("fixed-")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cap", type=int, default=24, help="X: the stub's in-flight cap")
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--concurrency", "-c", type=int, default=128)
    parser.add_argument("--requests", "-n", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--fixed", default=None, help="comma-separated fixed limits (default: X x 2/3..2)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="N=1500, fewer fixed settings")
    parser.add_argument("--json", default=None, help="write every figure to this file")
    args = parser.parse_args()
    cap = args.cap
    if args.quick:
        args.requests = 1500
    if args.fixed:
        fixed = sorted({int(k) for k in args.fixed.split(",")})
    elif args.quick:
        fixed = [cap, cap + cap // 3]
    else:
        fixed = sorted({max(1, round(cap * f)) for f in (2 / 3, 5 / 6, 1.0, 7 / 6, 4 / 3, 2.0)})
    settings = [f"fixed-{k}" for k in fixed] + ["adaptive"]
    config = StubConfig(latency_ms=args.latency_ms, max_in_flight=cap)
    print(
        f"stub: max_in_flight X={cap}, latency {args.latency_ms:g} ms, Retry-After "
        f"{config.retry_after_s:g} s (subprocess, 127.0.0.1); client: N={args.requests} "
        f"requests, C={args.concurrency} concurrent, {args.rounds} round(s), settings "
        + ", ".join(settings),
        flush=True,
    )
    rng = random.Random(args.seed)
    rates: dict[str, list[float]] = {s: [] for s in settings}
    answered: dict[str, int] = dict.fromkeys(settings, 0)
    limited: dict[str, int] = dict.fromkeys(settings, 0)
    adaptive_runs: list[dict[str, Any]] = []
    with StubServer(config, subprocess=True) as server:
        asyncio.run(_drive(server.base_url, _limiter(f"fixed-{cap}"), 200, cap))  # warm-up
        for round_index in range(args.rounds):
            order = settings[:]
            rng.shuffle(order)
            for setting in order:
                limiter = _limiter(setting)
                before = server.stats
                run = _drive(server.base_url, limiter, args.requests, args.concurrency)
                wall = asyncio.run(run)
                after = server.stats
                requests = after["requests"] - before["requests"]
                n429 = after["429"] - before["429"]
                rates[setting].append(args.requests / wall)
                answered[setting] += requests
                limited[setting] += n429
                line = (
                    f"round {round_index + 1} {setting:>9}: {args.requests / wall:7.1f} req/s, "
                    f"{n429:5d} x 429 of {requests} ({n429 / requests:.2%})"
                )
                if isinstance(limiter, AdaptiveLimiter):
                    snap = limiter.snapshot()
                    adaptive_runs.append(snap)
                    line += (
                        f"; limit {snap['limit']:.1f}, {snap['decreases']} decreases"
                        if snap["limit"] is not None
                        else "; no cap learned"
                    )
                print(line, flush=True)
    median = {s: statistics.median(v) for s, v in rates.items()}
    share = {s: limited[s] / answered[s] if answered[s] else 0.0 for s in settings}
    best = max((s for s in settings if s != "adaptive"), key=lambda s: median[s])
    ratio = median["adaptive"] / median[best]
    print("\nsetting      req/s (median)  429 share")
    for s in settings:
        print(f"{s:>10}  {median[s]:12.1f}  {share[s]:8.2%}")
    ok_ratio, ok_share = ratio >= THROUGHPUT_BAR, share["adaptive"] <= SHARE_429_BAR
    print(
        f"\nadaptive / best fixed ({best}): {ratio:.3f} (bar >= {THROUGHPUT_BAR}) "
        f"{'PASS' if ok_ratio else 'FAIL'}; adaptive 429 share {share['adaptive']:.2%} "
        f"(bar <= {SHARE_429_BAR:.0%}) {'PASS' if ok_share else 'FAIL'}; "
        f"overall {'PASS' if ok_ratio and ok_share else 'FAIL'}"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {
                    "settings": vars(args) | {"fixed": fixed},
                    "req_per_s": rates,
                    "answered": answered,
                    "answered_429": limited,
                    "best_fixed": best,
                    "ratio": ratio,
                    "adaptive_429_share": share["adaptive"],
                    "adaptive_limiters": adaptive_runs,
                    "pass": ok_ratio and ok_share,
                },
                out,
                indent=2,
            )


if __name__ == "__main__":
    main()
