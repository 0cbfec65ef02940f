"""Sandbox costs on this machine: a container's start to first output, cold and from the
warm pool, and code_exec's scoring throughput at a concurrency of 16 against the same
tasks run as plain subprocesses on the host (what vfops refuses to do with a model's
code). Both sides run in this process, one after the other, on the same tasks.

    .venv/bin/python bench/sandbox_start.py                # ~2 min
    .venv/bin/python bench/sandbox_start.py --starts 20 --rollouts 96

Needs podman and the base image (`vfops sandbox build-image`). Prints medians and the
ratios; nothing is written but the engine's containers, all removed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vfops.sandbox import Sandbox, SandboxLimits, SandboxPool


async def first_output_s(box: Sandbox) -> float:
    began = time.perf_counter()
    result = await box.run("echo ready")
    assert result.stdout == "ready\n", result
    return time.perf_counter() - began


async def cold_starts(n: int) -> list[float]:
    times = []
    for _ in range(n):
        box = Sandbox()
        times.append(await first_output_s(box))
        await box.close()
    return times


async def warm_starts(n: int) -> list[float]:
    times = []
    async with SandboxPool(1) as pool:
        for _ in range(n):
            while pool.warm < 1:  # noqa: ASYNC110 (a bench: the pool refills behind)
                await asyncio.sleep(0.02)
            async with pool.sandbox() as box:
                times.append(await first_output_s(box))
    return times


def tasks(count: int) -> list[dict[str, Any]]:
    import code_exec

    rows = code_exec.build_dataset(count)
    right = {  # a correct function per kind: the harness runs every test
        "reverse_words": "lambda s: ' '.join(reversed(s.split(' ')))",
        "count_vowels": "lambda s: sum(c in 'aeiou' for c in s)",
        "sum_even": "lambda xs: sum(x for x in xs if x % 2 == 0)",
        "second_largest": "lambda xs: sorted(set(xs))[-2] if len(set(xs)) > 1 else None",
        "gcd": "lambda a, b: __import__('math').gcd(a, b)",
        "digits_sum": "lambda n: sum(int(d) for d in str(abs(n)))",
        "dedupe": "lambda xs: list(dict.fromkeys(xs))",
    }
    for row in rows:
        name = row["info"]["function"]
        row["code"] = f"{name} = {right.get(name, 'lambda *a: None')}\n"
    return rows


def spec_files(row: dict[str, Any]) -> dict[str, str]:
    import code_exec

    spec = {"function": row["info"]["function"], "tests": row["info"]["tests"], "per_test_s": 2.0}
    return {"harness.py": code_exec.HARNESS, "solution.py": row["code"],
            "tests.json": json.dumps(spec)}  # fmt: skip


async def sandboxed(rows: list[dict[str, Any]], concurrency: int, pool_size: int) -> float:
    limit = asyncio.Semaphore(concurrency)
    async with SandboxPool(pool_size, limits=SandboxLimits(wall_s=30)) as pool:

        async def one(row: dict[str, Any]) -> None:
            async with limit, pool.sandbox() as box:
                result = await box.run(["python3", "harness.py"], files=spec_files(row))
                assert "VERDICTS" in result.stdout, result

        began = time.perf_counter()
        await asyncio.gather(*(one(row) for row in rows))
        return time.perf_counter() - began


async def on_host(rows: list[dict[str, Any]], concurrency: int) -> float:
    limit = asyncio.Semaphore(concurrency)

    async def one(row: dict[str, Any]) -> None:
        async with limit:
            with tempfile.TemporaryDirectory() as folder:
                for name, text in spec_files(row).items():
                    (Path(folder) / name).write_text(text)
                process = await asyncio.create_subprocess_exec(
                    sys.executable, "harness.py", cwd=folder, stdout=asyncio.subprocess.PIPE
                )
                out, _ = await process.communicate()
                assert b"VERDICTS" in out

    began = time.perf_counter()
    await asyncio.gather(*(one(row) for row in rows))
    return time.perf_counter() - began


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--rollouts", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pool", type=int, default=4, help="warm containers kept started")
    args = parser.parse_args()

    cold = statistics.median(await cold_starts(args.starts))
    warm = statistics.median(await warm_starts(args.starts))
    print(f"start to first output, median of {args.starts}: cold {cold:.3f} s, "
          f"warm pool {warm:.3f} s ({cold / warm:.1f}x)")  # fmt: skip

    rows = tasks(args.rollouts)
    host = await on_host(rows, args.concurrency)
    boxed = await sandboxed(rows, args.concurrency, args.pool)
    print(f"code_exec scoring, {args.rollouts} rollouts at -c {args.concurrency} "
          f"(pool {args.pool}): "
          f"host subprocesses {host:.1f} s ({args.rollouts / host:.1f}/s), sandboxed "
          f"{boxed:.1f} s ({args.rollouts / boxed:.1f}/s); sandboxed / host = "
          f"{boxed / host:.2f}x the time")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
