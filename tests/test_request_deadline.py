"""A request's time limit is wall-clock for the whole exchange (issue 44, item 7).

An endpoint that drips its body one byte at a time keeps aiohttp's per-read timeout
from ever firing; ``--request-timeout`` must still end the request, and the rollout
is then an error (never scored) within about the timeout times the attempts.

The dripping endpoint is a real aiohttp server on loopback (``tests.http_fixtures``);
``vfops eval`` runs in a subprocess (``tests.test_bad_input``'s helper) while this
test's event loop serves it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from tests.http_fixtures import loopback_server
from tests.test_bad_input import vfops
from vfops.clients import APITimeoutError, OpenAIClient

DRIP_EVERY_S = 0.25
"""One byte of the body per this many seconds."""

BODY = orjson.dumps(
    {
        "id": "drip",
        "object": "chat.completion",
        "model": "stub-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "4"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
)
"""A valid completion: sent whole it would be scored. At DRIP_EVERY_S a byte it takes
about a minute, far past the timeouts below, while every read waits only 0.25 s."""


async def _drip(request: web.Request) -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = len(BODY)
    await response.prepare(request)
    for index in range(len(BODY)):
        await response.write(BODY[index : index + 1])
        await asyncio.sleep(DRIP_EVERY_S)
    await response.write_eof()
    return response


async def _models(_request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "stub-model"}]})


ROUTES = {("POST", "/v1/chat/completions"): _drip, ("GET", "/v1/models"): _models}


async def test_a_dripping_body_times_out_at_the_wall_clock_limit() -> None:
    async with (
        loopback_server(ROUTES) as base_url,
        OpenAIClient(base_url, timeout_s=1.0, max_retries=0) as client,
    ):
        started = time.monotonic()
        with pytest.raises(APITimeoutError) as info:
            await client.chat(model="stub-model", messages=[{"role": "user", "content": "2+2"}])
        elapsed = time.monotonic() - started
    assert elapsed < 3.0, elapsed  # one attempt of 1 s, not the ~60 s the drip takes
    assert "response body not complete within 1.0 s" in str(info.value)


async def test_a_dripping_endpoint_errors_the_rollout_within_the_timeouts(tmp_path: Path) -> None:
    """The probe: ``--request-timeout`` against an endpoint that drips its body. The
    rollout is an error of generation (reward None) and the run exits 3, in about
    three attempts of the timeout (plus backoff and start-up), not after the drip."""
    (tmp_path / "home").mkdir()
    async with loopback_server(ROUTES) as base_url:
        started = time.monotonic()
        done = await asyncio.to_thread(
            vfops,
            ["eval", "arithmetic", "-m", "stub-model", "-b", base_url, "-n", "1", "-r", "1",
             "--request-timeout", "1", "-o", str(tmp_path / "out"), "-q"],
            tmp_path, {},
        )  # fmt: skip
        elapsed = time.monotonic() - started
    assert done.returncode == 3, done.stdout + done.stderr
    assert elapsed < 30.0, elapsed  # 3 attempts x 1 s + backoff + start-up
    (results,) = (tmp_path / "out").rglob("results.jsonl")
    (row,) = [orjson.loads(line) for line in results.read_bytes().splitlines()]
    assert row["reward"] is None and row["stop_reason"] == "error", row
    error = row["error"]
    assert (error["type"], error["stage"]) == ("APITimeoutError", "generation"), error
    assert "response body not complete within 1.0 s; timed out 3 times" in error["message"]


async def test_waiting_for_a_free_connection_is_not_counted() -> None:
    """Three requests through one connection, each answered in 0.6 s: the last waits
    1.2 s for the connection, then gets its answer well within its 1 s; only the time
    a request holds a connection counts (queueing is not a slow server)."""

    async def slow(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(0.6)
        return web.Response(body=BODY, content_type="application/json")

    routes = {("POST", "/v1/chat/completions"): slow}
    async with (
        loopback_server(routes) as base_url,
        OpenAIClient(base_url, timeout_s=1.0, max_retries=0, max_connections=1) as client,
    ):
        replies = await asyncio.gather(
            *(
                client.chat(model="stub-model", messages=[{"role": "user", "content": "2+2"}])
                for _ in range(3)
            )
        )
    assert [reply.message["content"] for reply in replies] == ["4", "4", "4"]
