"""The OpenAI-compatible stub server: replies, n, faults, limits, modes of running."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson
import pytest

from vfops.testing import StubConfig, StubServer
from vfops.testing._stub_server import arithmetic_reply, config_to_argv, echo_answer_reply
from vfops.testing.stub_server import build_parser


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]


async def _post(
    session: aiohttp.ClientSession, base_url: str, body: dict[str, Any]
) -> tuple[int, dict[str, str], bytes]:
    async with session.post(f"{base_url}/chat/completions", data=orjson.dumps(body)) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def _chat(base_url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as session:
        return await _post(session, base_url, body)


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("What is 12 * 7?", "84"),
        ("Compute 100 - 250.", "-150"),
        ("3 + 4", "7"),
        ("What is 7 x 6?", "42"),
        ("81 / 9 = ?", "9"),
        ("1 / 4", "0.25"),
        ("-5 + -5", "-10"),
    ],
)
def test_arithmetic_reply(text: str, answer: str) -> None:
    reply = arithmetic_reply(text)
    assert reply.startswith("<think>")
    assert reply.endswith(f"\n<answer>{answer}</answer>")


def test_echo_answer_reply() -> None:
    assert echo_answer_reply("Question?\nANSWER_HINT: Paris\n") == "<answer>Paris</answer>"
    assert echo_answer_reply("no hint here") == "ok"


async def test_arithmetic_over_http_with_n_choices_and_usage() -> None:
    with StubServer(StubConfig(reply_mode="arithmetic")) as server:
        status, headers, raw = await _chat(
            server.base_url, {"model": "m", "messages": _user("What is 21 + 21?"), "n": 3}
        )
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    data = orjson.loads(raw)
    assert [c["index"] for c in data["choices"]] == [0, 1, 2]
    for choice in data["choices"]:
        assert choice["message"]["content"].endswith("<answer>42</answer>")
        assert choice["finish_reason"] == "stop"
    assert data["model"] == "m"
    usage = data["usage"]
    assert usage["prompt_tokens"] == 2 + 5  # words in the messages
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert server.stats["ok"] == 1


async def test_echo_answer_and_models_endpoint() -> None:
    with StubServer(StubConfig(model_name="tiny")) as server:
        status, _, raw = await _chat(
            server.base_url, {"model": "m", "messages": _user("Q\nANSWER_HINT: 17")}
        )
        assert status == 200
        assert orjson.loads(raw)["choices"][0]["message"]["content"] == "<answer>17</answer>"
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{server.base_url}/models") as resp,
        ):
            models = await resp.json()
    assert [m["id"] for m in models["data"]] == ["tiny"]


async def test_callable_reply_with_tool_calls() -> None:
    seen: list[dict[str, Any]] = []

    def reply(request: dict[str, Any]) -> dict[str, Any]:
        seen.append(request)
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                }
            ],
        }

    with StubServer(StubConfig(reply_mode=reply)) as server:
        tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
        status, _, raw = await _chat(
            server.base_url, {"model": "m", "messages": _user("add"), "tools": tools}
        )
    assert status == 200
    choice = orjson.loads(raw)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "add"
    assert seen[0]["tools"] == tools


async def test_faults_follow_seeded_rates() -> None:
    config = StubConfig(rate_429=0.1, rate_500=0.2, rate_malformed=0.1, seed=7, retry_after_s=2)
    counts = []
    for _ in range(2):
        with StubServer(config) as server:
            async with aiohttp.ClientSession() as session:
                results = await asyncio.gather(
                    *(
                        _post(session, server.base_url, {"model": "m", "messages": _user("hi")})
                        for _ in range(1000)
                    )
                )
            stats = server.stats
        counts.append(stats)
        assert stats["requests"] == 1000
        assert abs(stats["429"] - 100) < 45
        assert abs(stats["500"] - 200) < 60
        assert abs(stats["malformed"] - 100) < 45
        assert stats["ok"] == 1000 - stats["429"] - stats["500"] - stats["malformed"]
        by_status = [status for status, _, _ in results]
        assert by_status.count(429) == stats["429"]
        assert by_status.count(500) == stats["500"]
        for status, headers, body in results:
            if status == 429:
                assert headers["Retry-After"] == "2"
            elif status == 200:
                try:
                    orjson.loads(body)
                except orjson.JSONDecodeError:
                    continue
                assert b"choices" in body
    assert counts[0] == counts[1]  # same seed, same fault sequence


async def test_fail_first_n_is_deterministic() -> None:
    with StubServer(StubConfig(fail_first_n=2, fail_first_kind="503")) as server:
        statuses = [
            (await _chat(server.base_url, {"model": "m", "messages": _user("x")}))[0]
            for _ in range(3)
        ]
    assert statuses == [503, 503, 200]


async def test_malformed_body_is_invalid_json() -> None:
    with StubServer(StubConfig(fail_first_n=1, fail_first_kind="malformed")) as server:
        status, _, raw = await _chat(server.base_url, {"model": "m", "messages": _user("x")})
    assert status == 200
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw)


async def test_timeout_fault_hangs_until_the_client_gives_up() -> None:
    with StubServer(StubConfig(fail_first_n=1, fail_first_kind="timeout")) as server:
        async with aiohttp.ClientSession() as session:
            start = time.perf_counter()
            with pytest.raises(asyncio.TimeoutError):
                async with asyncio.timeout(0.3):
                    await _post(session, server.base_url, {"model": "m", "messages": _user("x")})
            assert time.perf_counter() - start >= 0.29
            status, _, _ = await _post(
                session, server.base_url, {"model": "m", "messages": _user("x")}
            )
        assert status == 200
        assert server.stats["timeout"] == 1


async def test_context_limit_returns_openai_error_shape() -> None:
    with StubServer(StubConfig(context_limit_chars=50)) as server:
        ok, _, _ = await _chat(server.base_url, {"model": "m", "messages": _user("short")})
        status, _, raw = await _chat(
            server.base_url, {"model": "m", "messages": _user("long " * 20)}
        )
    assert ok == 200
    assert status == 400
    error = orjson.loads(raw)["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert "maximum context length" in error["message"]


async def test_api_key_enforced_and_bad_body_rejected() -> None:
    with StubServer(StubConfig(api_key="sk-stub")) as server:
        status, _, raw = await _chat(server.base_url, {"model": "m", "messages": _user("x")})
        assert status == 401
        assert orjson.loads(raw)["error"]["code"] == "invalid_api_key"
        async with (
            aiohttp.ClientSession(headers={"Authorization": "Bearer sk-stub"}) as session,
        ):
            assert (await _post(session, server.base_url, {"model": "m", "messages": _user("x")}))[
                0
            ] == 200
            async with session.post(f"{server.base_url}/chat/completions", data=b"{") as resp:
                assert resp.status == 400


def test_record_requests_in_process() -> None:
    with StubServer(StubConfig(record_requests=True)) as server:
        asyncio.run(_chat(server.base_url, {"model": "m", "messages": _user("x"), "seed": 3}))
        assert server.requests[0]["seed"] == 3


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="sum"):
        StubConfig(rate_429=0.6, rate_500=0.6)
    with pytest.raises(ValueError, match="reply_mode"):
        StubConfig(reply_mode="poetry")
    with pytest.raises(ValueError, match="fail_first_kind"):
        StubConfig(fail_first_kind="teapot")  # type: ignore[arg-type]


def test_config_round_trips_through_the_command_line() -> None:
    config = StubConfig(
        latency_ms=200, rate_429=0.05, retry_after_s=None, reply_mode="arithmetic",
        fail_first_n=3, fail_first_kind="timeout", context_limit_chars=1000, seed=None,
        models_status=404, reject_unknown_model=True,
    )  # fmt: skip
    args = vars(build_parser().parse_args(config_to_argv(config)))
    for key in ("latency_ms", "rate_429", "retry_after_s", "reply_mode", "fail_first_n",
                "fail_first_kind", "context_limit_chars", "seed", "models_status",
                "reject_unknown_model"):  # fmt: skip
        assert args[key] == getattr(config, key), key
    with pytest.raises(ValueError, match="in-process"):
        config_to_argv(StubConfig(reply_mode=lambda request: {"content": "x"}))


async def test_subprocess_server_serves_and_reports_stats() -> None:
    with StubServer(StubConfig(reply_mode="arithmetic", latency_ms=10), subprocess=True) as server:
        status, _, raw = await _chat(server.base_url, {"model": "m", "messages": _user("2 * 8")})
        assert status == 200
        assert orjson.loads(raw)["choices"][0]["message"]["content"].endswith("<answer>16</answer>")
        assert server.stats["ok"] == 1


async def test_holds_hundreds_of_requests_at_once_at_200ms_latency() -> None:
    # Latency is a sleep, not a worker: the stub must hold every concurrent request at
    # once (what the throughput benchmarks rely on), checked by its own in-flight
    # count rather than by a rate (a timed assertion would be noise on a busy machine).
    n, concurrency = 3000, 512
    with StubServer(StubConfig(latency_ms=200, reply_mode="arithmetic"), subprocess=True) as server:
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            body = {"model": "m", "messages": _user("What is 2 + 2?")}
            remaining = n
            statuses: list[int] = []

            async def worker() -> None:
                nonlocal remaining
                while remaining > 0:
                    remaining -= 1
                    statuses.append((await _post(session, server.base_url, body))[0])

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        stats = server.stats
    assert statuses == [200] * n
    assert stats["ok"] == n and stats["in_flight"] == 0
    assert stats["max_in_flight"] >= concurrency * 0.9, stats
