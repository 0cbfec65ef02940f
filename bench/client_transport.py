"""Client benchmark: vfops' OpenAIClient against the ``openai`` SDK, on the stub.

Runs N chat requests at concurrency C against the ``vfops.testing`` stub server
(in a subprocess, so ``time.process_time`` counts the client process only) at each
latency, and prints requests/s and client CPU ms/request for each request path,
in the same run:

- ``vfops``: :class:`vfops.clients.OpenAIClient` (aiohttp session, orjson, no SDK);
- ``sdk-post``: ``openai.AsyncOpenAI``'s low-level ``post`` + orjson, retries off
  (how OpenAIClient sent requests before it dropped the SDK): the baseline;
- ``sdk-raw``: ``chat.completions.with_raw_response.create`` + orjson;
- ``sdk-parsed``: ``chat.completions.create`` -> pydantic ``ChatCompletion``.

The SDK paths use its aiohttp transport (``--sdk-transport httpx`` for httpx). It
also times a fresh process importing ``vfops.clients`` and ``openai``.

    .venv/bin/python bench/client_transport.py --requests 5000 --concurrency 256
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from vfops.clients import OpenAIClient
from vfops.clients._openai import DEFAULT_MAX_CONNECTIONS
from vfops.testing import StubConfig, StubServer

MESSAGES = [
    {"role": "system", "content": "Think step by step inside <think> tags, answer in <answer>."},
    {"role": "user", "content": "What is 123 + 456?"},
]
SAMPLING = {"temperature": 0.7, "max_tokens": 256}
PATHS = ("vfops", "sdk-post", "sdk-raw", "sdk-parsed")
BASELINE = "sdk-post"

Call = Callable[[], Awaitable[Any]]


async def _drive(call: Call, n: int, concurrency: int) -> None:
    remaining = n

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await call()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _measure(call: Call, n: int, concurrency: int) -> dict[str, float]:
    await _drive(call, min(n, concurrency * 2), concurrency)  # warm-up: open the pool
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await _drive(call, n, concurrency)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"req_per_s": n / wall, "cpu_ms_per_req": cpu / n * 1000.0, "wall_s": wall}


def _check(content: str | None) -> None:
    assert "<answer>579</answer>" in (content or ""), content


async def _run_vfops(base_url: str, n: int, concurrency: int) -> dict[str, float]:
    async with OpenAIClient(base_url) as client:

        async def call() -> None:
            response = await client.chat(model="stub", messages=MESSAGES, sampling_args=SAMPLING)
            _check(response.message["content"])

        return await _measure(call, n, concurrency)


async def _run_sdk(
    base_url: str, path: str, transport: str, n: int, concurrency: int
) -> dict[str, float]:
    import httpx2  # what this openai build is built on
    import openai

    limits = httpx2.Limits(
        max_connections=DEFAULT_MAX_CONNECTIONS, max_keepalive_connections=DEFAULT_MAX_CONNECTIONS
    )
    http: httpx2.AsyncClient = (
        openai.DefaultAioHttpClient(limits=limits)
        if transport == "aiohttp"
        else openai.DefaultAsyncHttpxClient(limits=limits)
    )
    sdk = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, http_client=http)
    payload = {"model": "stub", "messages": MESSAGES, **SAMPLING}

    async def call_post() -> None:
        response = await sdk.post(
            "/chat/completions", cast_to=httpx2.Response, content=orjson.dumps(payload)
        )
        _check(orjson.loads(response.content)["choices"][0]["message"]["content"])

    async def call_raw() -> None:
        raw = await sdk.chat.completions.with_raw_response.create(**payload)  # type: ignore[call-overload]
        _check(orjson.loads(raw.content)["choices"][0]["message"]["content"])

    async def call_parsed() -> None:
        completion = await sdk.chat.completions.create(**payload)  # type: ignore[call-overload]
        _check(completion.choices[0].message.content)

    calls = {"sdk-post": call_post, "sdk-raw": call_raw, "sdk-parsed": call_parsed}
    try:
        return await _measure(calls[path], n, concurrency)
    finally:
        await sdk.close()


def run_path(
    base_url: str, path: str, sdk_transport: str, n: int, concurrency: int
) -> dict[str, float]:
    if path == "vfops":
        return asyncio.run(_run_vfops(base_url, n, concurrency))
    return asyncio.run(_run_sdk(base_url, path, sdk_transport, n, concurrency))


def import_seconds(module: str, repeats: int = 3) -> float:
    """Best-of wall time for a fresh interpreter to import ``module``."""
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    runs = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout)
        for _ in range(repeats)
    ]  # fmt: skip
    return min(runs)


def _print_row(row: dict[str, dict[str, float]], latency: float, n: int, concurrency: int) -> None:
    base = row.get(BASELINE)
    print(f"\nstub latency {latency:.0f} ms, N={n}, C={concurrency}")
    print(f"  {'path':<11} {'req/s':>9} {'CPU ms/req':>11} {'CPU vs ' + BASELINE:>16}")
    for path, r in row.items():
        ratio = f"x{r['cpu_ms_per_req'] / base['cpu_ms_per_req']:.2f}" if base else "-"
        print(f"  {path:<11} {r['req_per_s']:>9.0f} {r['cpu_ms_per_req']:>11.3f} {ratio:>16}")
    if "vfops" in row and base:
        saved = base["cpu_ms_per_req"] - row["vfops"]["cpu_ms_per_req"]
        print(f"  vfops saves {saved:.3f} CPU ms per request against {BASELINE}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--latencies", default="0,200", help="stub latency in ms, comma-separated")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"any of {', '.join(PATHS)}")
    parser.add_argument("--sdk-transport", choices=["aiohttp", "httpx"], default="aiohttp")
    parser.add_argument("--no-imports", action="store_true", help="skip the import timings")
    parser.add_argument("--json", default=None, help="write results to this file")
    args = parser.parse_args()

    latencies = [float(x) for x in args.latencies.split(",") if x]
    paths = [p for p in args.paths.split(",") if p]
    unknown = set(paths) - set(PATHS)
    if unknown:
        parser.error(f"unknown --paths {sorted(unknown)}; choose from {', '.join(PATHS)}")
    results: list[dict[str, Any]] = []

    if not args.no_imports:
        imports = {m: import_seconds(m) for m in ("vfops.clients", "openai")}
        print("fresh-process import: " + ", ".join(f"{m} {s:.3f} s" for m, s in imports.items()))
        results.append({"imports_s": imports})

    for latency in latencies:
        config = StubConfig(latency_ms=latency, reply_mode="arithmetic")
        with StubServer(config, subprocess=True) as server:
            row: dict[str, dict[str, float]] = {}
            for path in paths:
                row[path] = run_path(
                    server.base_url, path, args.sdk_transport, args.requests, args.concurrency
                )
                results.append(
                    {
                        "latency_ms": latency,
                        "path": path,
                        "sdk_transport": args.sdk_transport,
                        "requests": args.requests,
                        "concurrency": args.concurrency,
                        **row[path],
                    }
                )
            _print_row(row, latency, args.requests, args.concurrency)
            stats = server.stats
            print(f"  stub served {stats['ok']} ok / {stats['requests']} requests")

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
