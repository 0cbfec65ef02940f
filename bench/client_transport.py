"""Client transport benchmark: aiohttp vs httpx under OpenAIClient, against the stub.

Runs N chat requests at concurrency C against ``vfops.testing`` stub server (in a
subprocess, so ``time.process_time`` counts the client process only) at each
latency, and prints requests/s and client CPU ms/request per transport, side by
side. ``--paths`` also compares request paths on one transport: ``vfops``
(OpenAIClient: SDK low-level post + orjson), ``sdk-raw``
(``chat.completions.with_raw_response.create`` + orjson) and ``sdk-parsed``
(``chat.completions.create`` -> pydantic ``ChatCompletion``).

    .venv/bin/python bench/client_transport.py --requests 5000 --concurrency 256
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import openai
import orjson

from vfops.clients import OpenAIClient
from vfops.clients._openai import DEFAULT_MAX_CONNECTIONS
from vfops.testing import StubConfig, StubServer

MESSAGES = [
    {"role": "system", "content": "Think step by step inside <think> tags, answer in <answer>."},
    {"role": "user", "content": "What is 123 + 456?"},
]
SAMPLING = {"temperature": 0.7, "max_tokens": 256}

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


def _sdk_client(base_url: str, transport: str) -> openai.AsyncOpenAI:
    limits = httpx2.Limits(
        max_connections=DEFAULT_MAX_CONNECTIONS, max_keepalive_connections=DEFAULT_MAX_CONNECTIONS
    )
    http: httpx2.AsyncClient = (
        openai.DefaultAioHttpClient(limits=limits)
        if transport == "aiohttp"
        else openai.DefaultAsyncHttpxClient(limits=limits)
    )
    return openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, http_client=http)


async def run_variant(
    base_url: str, transport: str, path: str, n: int, concurrency: int
) -> dict[str, float]:
    if path == "vfops":
        client = OpenAIClient(base_url, transport=transport)  # type: ignore[arg-type]

        async def call() -> Any:
            response = await client.chat(model="stub", messages=MESSAGES, sampling_args=SAMPLING)
            assert "<answer>579</answer>" in (response.message["content"] or "")
            return response

        try:
            return await _measure(call, n, concurrency)
        finally:
            await client.aclose()

    sdk = _sdk_client(base_url, transport)

    async def call_raw() -> Any:
        raw = await sdk.chat.completions.with_raw_response.create(
            model="stub",
            messages=MESSAGES,
            **SAMPLING,  # type: ignore[arg-type]
        )
        data = orjson.loads(raw.content)
        assert "579" in data["choices"][0]["message"]["content"]
        return data

    async def call_parsed() -> Any:
        completion = await sdk.chat.completions.create(
            model="stub",
            messages=MESSAGES,
            **SAMPLING,  # type: ignore[arg-type]
        )
        assert "579" in (completion.choices[0].message.content or "")
        return completion

    try:
        return await _measure(call_raw if path == "sdk-raw" else call_parsed, n, concurrency)
    finally:
        await sdk.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--latencies", default="0,200", help="stub latency in ms, comma-separated")
    parser.add_argument("--transports", default="aiohttp,httpx")
    parser.add_argument(
        "--paths", default="", help="also compare request paths, e.g. vfops,sdk-raw,sdk-parsed"
    )
    parser.add_argument("--paths-transport", default="aiohttp")
    parser.add_argument("--json", default=None, help="write results to this file")
    args = parser.parse_args()

    latencies = [float(x) for x in args.latencies.split(",") if x]
    transports = [t for t in args.transports.split(",") if t]
    results: list[dict[str, Any]] = []

    for latency in latencies:
        config = StubConfig(latency_ms=latency, reply_mode="arithmetic")
        with StubServer(config, subprocess=True) as server:
            row: dict[str, dict[str, float]] = {}
            for transport in transports:
                r = asyncio.run(
                    run_variant(
                        server.base_url, transport, "vfops", args.requests, args.concurrency
                    )
                )
                row[transport] = r
                results.append(
                    {
                        "latency_ms": latency,
                        "transport": transport,
                        "path": "vfops",
                        "requests": args.requests,
                        "concurrency": args.concurrency,
                        **r,
                    }
                )
            print(f"\nstub latency {latency:.0f} ms, N={args.requests}, C={args.concurrency}")
            print(f"  {'transport':<10} {'req/s':>9} {'CPU ms/req':>11}")
            for transport, r in row.items():
                print(f"  {transport:<10} {r['req_per_s']:>9.0f} {r['cpu_ms_per_req']:>11.3f}")
            if "aiohttp" in row and "httpx" in row:
                a, h = row["aiohttp"], row["httpx"]
                print(
                    f"  aiohttp/httpx: throughput x{a['req_per_s'] / h['req_per_s']:.2f}, "
                    f"CPU per request x{a['cpu_ms_per_req'] / h['cpu_ms_per_req']:.2f}"
                )

            paths = [p for p in args.paths.split(",") if p]
            if paths:
                print(f"  request paths on {args.paths_transport}:")
                for path in paths:
                    r = asyncio.run(
                        run_variant(
                            server.base_url,
                            args.paths_transport,
                            path,
                            args.requests,
                            args.concurrency,
                        )
                    )
                    results.append(
                        {
                            "latency_ms": latency,
                            "transport": args.paths_transport,
                            "path": path,
                            "requests": args.requests,
                            "concurrency": args.concurrency,
                            **r,
                        }
                    )
                    print(
                        f"    {path:<11} {r['req_per_s']:>9.0f} req/s "
                        f"{r['cpu_ms_per_req']:>8.3f} CPU ms/req"
                    )
            stats = server.stats
            print(f"  stub served {stats['ok']} ok / {stats['requests']} requests")

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
