"""OpenAIClient over real HTTP against the stub, the retry policy, and endpoints."""

from __future__ import annotations

import asyncio
import pickle
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDict

import vfops.clients as clients
from tests.http_fixtures import Handler, free_port, loopback_server
from vfops._errors import EndpointError
from vfops.clients import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ChatResponse,
    ConflictError,
    Endpoint,
    InternalServerError,
    MalformedResponseError,
    ModelClient,
    NotFoundError,
    OpenAIClient,
    PermissionDeniedError,
    PromptTooLongError,
    RateLimitError,
    RequestLimiter,
    RequestTooLargeError,
    RetryPolicy,
    UnprocessableEntityError,
    check_reachable,
    load_endpoints,
    read_api_key,
    resolve_endpoint,
)
from vfops.clients._errors import error_from_response
from vfops.clients._openai import is_context_error, parse_chat_completion
from vfops.clients._retry import (
    RATE_LIMIT_JITTER,
    RATE_LIMIT_MIN_WAIT_S,
    RetryState,
    parse_duration,
    parse_rate_limit_reset,
    parse_retry_after,
    retry_after_of,
    status_of,
)
from vfops.testing import StubConfig, StubServer

FAST = RetryPolicy(max_retries=3, base_delay_s=0.001, max_delay_s=5.0)


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


# --------------------------------------------------------------------------- client


def test_public_api() -> None:
    assert sorted(clients.__all__) == sorted(
        ["ModelClient", "ChatResponse", "PromptTooLongError", "OpenAIClient", "ScriptedClient",
         "RetryPolicy", "RequestLimiter", "Endpoint", "load_endpoints", "resolve_endpoint",
         "read_api_key", "check_reachable",
         "APIError", "APIStatusError", "APITimeoutError", "APIConnectionError",
         "MalformedResponseError", "BadRequestError", "AuthenticationError",
         "PermissionDeniedError", "NotFoundError", "ConflictError", "RequestTooLargeError",
         "UnprocessableEntityError", "RateLimitError", "InternalServerError",
         "DEFAULT_API_KEY_VAR", "HTTPTransport", "is_context_error", "is_loopback",
         "DEFAULT_MAX_RETRIES", "DEFAULT_MAX_RETRY_WAIT_S", "DEFAULT_MAX_TIMEOUT_RETRIES",
         "redact_secrets", "TOKENS_KEY",
         "ChatRequest", "RequestMiddleware", "PricedRequests", "installed_middleware"]
    )  # fmt: skip
    assert isinstance(OpenAIClient("http://127.0.0.1:1/v1"), ModelClient)


async def test_plain_success() -> None:
    with StubServer(StubConfig(api_key="sk-test-123")) as server:
        client = OpenAIClient(server.base_url, "sk-test-123")
        try:
            response = await client.chat(
                model="stub", messages=[{"role": "system", "content": "be brief"},
                                        *_user("Capital?\nANSWER_HINT: Paris")]
            )  # fmt: skip
        finally:
            await client.aclose()
    assert isinstance(response, ChatResponse)
    assert response.message == {"role": "assistant", "content": "<answer>Paris</answer>"}
    assert type(response.message) is dict
    assert response.finish_reason == "stop"
    assert response.prompt_tokens == 2 + 3
    assert response.completion_tokens == 1
    assert response.raw is not None and response.raw["object"] == "chat.completion"


async def test_sampling_args_pass_through() -> None:
    with StubServer(StubConfig(record_requests=True)) as server:
        async with OpenAIClient(server.base_url) as client:
            await client.chat(
                model="stub",
                messages=_user("hi"),
                sampling_args={"temperature": 0.3, "max_tokens": 64, "top_k": 20, "n": 1,
                               "extra_body": {"repetition_penalty": 1.1}},
            )  # fmt: skip
            with pytest.raises(ValueError, match="n must be 1"):
                await client.chat(model="stub", messages=_user("hi"), sampling_args={"n": 4})
        body = server.requests[0]
    assert body["model"] == "stub"
    assert body["messages"] == _user("hi")
    assert body["temperature"] == 0.3
    assert body["max_tokens"] == 64
    assert body["top_k"] == 20
    assert body["repetition_penalty"] == 1.1
    assert "extra_body" not in body
    assert "tools" not in body


async def test_tool_calls_round_trip() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two integers.",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                },
            },
        }
    ]

    def reply(request: dict[str, Any]) -> dict[str, Any]:
        last = request["messages"][-1]
        if last["role"] == "tool":
            return {"role": "assistant", "content": f"<answer>{last['content']}</answer>"}
        assert request["tools"] == tools
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_7", "type": "function",
                            "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}],
        }  # fmt: skip

    with StubServer(StubConfig(reply_mode=reply)) as server:
        async with OpenAIClient(server.base_url) as client:
            messages = _user("What is 2 + 3? Use the tool.")
            first = await client.chat(model="stub", messages=messages, tools=tools)
            assert first.finish_reason == "tool_calls"
            assert first.message == {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_7", "type": "function",
                                "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}],
            }  # fmt: skip
            messages.append(first.message)
            messages.append({"role": "tool", "tool_call_id": "call_7", "content": "5"})
            second = await client.chat(model="stub", messages=messages, tools=tools)
    assert second.message["content"] == "<answer>5</answer>"
    assert second.finish_reason == "stop"
    assert "tool_calls" not in second.message


async def test_429_retry_after_is_honoured() -> None:
    config = StubConfig(fail_first_n=1, fail_first_kind="429", retry_after_s=0.4)
    with StubServer(config) as server:
        async with OpenAIClient(server.base_url, backoff=FAST) as client:
            start = time.perf_counter()
            response = await client.chat(model="stub", messages=_user("ANSWER_HINT: 1"))
            elapsed = time.perf_counter() - start
        assert server.stats["429"] == 1
        assert server.stats["ok"] == 1
    assert response.message["content"] == "<answer>1</answer>"
    assert elapsed >= 0.4  # the wait the server asked for (a lower bound: time only adds)


async def test_500_retried_then_success() -> None:
    with StubServer(StubConfig(fail_first_n=2, fail_first_kind="500")) as server:
        async with OpenAIClient(server.base_url, backoff=FAST) as client:
            response = await client.chat(model="stub", messages=_user("x"))
        assert server.stats["500"] == 2
        assert server.stats["requests"] == 3
    assert response.message["content"] == "ok"


async def test_timeouts_retried() -> None:
    with StubServer(StubConfig(fail_first_n=1, fail_first_kind="timeout")) as server:
        async with OpenAIClient(server.base_url, timeout_s=0.3, backoff=FAST) as client:
            start = time.perf_counter()
            response = await client.chat(model="stub", messages=_user("x"))
            elapsed = time.perf_counter() - start
        assert server.stats["timeout"] == 1
        assert server.stats["ok"] == 1
    assert response.message["content"] == "ok"
    assert elapsed >= 0.3


async def test_timeouts_exhausted_raise_timeout_error() -> None:
    with StubServer(StubConfig(fail_first_n=10, fail_first_kind="timeout")) as server:
        policy = RetryPolicy(max_retries=1, base_delay_s=0.001)
        async with OpenAIClient(server.base_url, timeout_s=0.2, backoff=policy) as client:
            with pytest.raises(APITimeoutError) as info:
                await client.chat(model="stub", messages=_user("x"))
        assert server.stats["timeout"] == 2
    assert isinstance(info.value, ConnectionError)  # generic transient-error handlers see it
    assert not isinstance(info.value, TimeoutError)  # environments' own deadlines are those
    assert str(info.value) == (
        f"POST {server.base_url}/chat/completions: no response within 0.2 s; "
        "retried 1 times (max_retries)"
    )


async def test_malformed_json_retried() -> None:
    with StubServer(StubConfig(fail_first_n=2, fail_first_kind="malformed")) as server:
        async with OpenAIClient(server.base_url, backoff=FAST) as client:
            response = await client.chat(model="stub", messages=_user("x"))
        assert server.stats["malformed"] == 2
    assert response.message["content"] == "ok"


async def test_non_retryable_400_is_not_retried() -> None:
    with StubServer(StubConfig(fail_first_n=5, fail_first_kind="400")) as server:
        async with OpenAIClient(server.base_url, backoff=FAST) as client:
            with pytest.raises(BadRequestError) as info:
                await client.chat(model="stub", messages=_user("x"))
        assert server.stats["requests"] == 1
    exc = info.value
    assert exc.status_code == 400
    assert not isinstance(exc, PromptTooLongError)
    # the server's explanation, not just the status, is what a rollout error records
    assert str(exc) == (
        "HTTP 400 Bad Request: Invalid value for 'temperature' (stub) (code: invalid_value)"
    )
    assert exc.message == "Invalid value for 'temperature' (stub)"
    assert exc.code == "invalid_value"
    assert exc.error_type == "invalid_request_error"
    assert exc.body["error"]["param"] == "temperature"


async def test_auth_error_is_not_retried() -> None:
    with StubServer(StubConfig(api_key="right")) as server:
        async with OpenAIClient(server.base_url, "wrong", backoff=FAST) as client:
            with pytest.raises(AuthenticationError, match=r"HTTP 401.*Incorrect API key"):
                await client.chat(model="stub", messages=_user("x"))
        assert server.stats["requests"] == 1


async def test_context_too_long_raises_prompt_too_long() -> None:
    with StubServer(StubConfig(context_limit_chars=100)) as server:
        async with OpenAIClient(server.base_url, backoff=FAST) as client:
            ok = await client.chat(model="stub", messages=_user("short"))
            with pytest.raises(PromptTooLongError, match="maximum context length") as info:
                await client.chat(model="stub", messages=_user("word " * 100))
        assert server.stats["context"] == 1
        assert server.stats["requests"] == 2
    assert ok.message["content"] == "ok"
    assert isinstance(info.value.__cause__, BadRequestError)


async def test_retries_exhausted_raise_last_error() -> None:
    with StubServer(StubConfig(fail_first_n=100, fail_first_kind="500")) as server:
        policy = RetryPolicy(max_retries=2, base_delay_s=0.001)
        async with OpenAIClient(server.base_url, backoff=policy) as client:
            with pytest.raises(InternalServerError, match=r"HTTP 500 .*\(stub\)"):
                await client.chat(model="stub", messages=_user("x"))
        assert server.stats["requests"] == 3


async def test_max_retries_zero_makes_one_attempt() -> None:
    with StubServer(StubConfig(fail_first_n=100, fail_first_kind="500")) as srv:
        async with OpenAIClient(srv.base_url, max_retries=0) as client:
            with pytest.raises(InternalServerError) as info:
                await client.chat(model="stub", messages=_user("x"))
        assert srv.stats["requests"] == 1
    assert str(info.value) == "HTTP 500 Internal Server Error: The server had an error (stub)"


async def test_max_retry_wait_zero_fails_on_the_first_rate_limit() -> None:
    with StubServer(StubConfig(fail_first_n=100, fail_first_kind="429", retry_after_s=0)) as srv:
        async with OpenAIClient(srv.base_url, max_retry_wait_s=0) as client:
            with pytest.raises(RateLimitError, match=r"over max_retry_wait_s \(0 s"):
                await client.chat(model="stub", messages=_user("x"))
        assert srv.stats["requests"] == 1


async def test_rate_limits_that_name_their_wait_are_not_counted_as_retries() -> None:
    """A 429 with Retry-After asks to slow down: it is waited out however often it
    comes (within max_retry_wait_s), even with max_retries=0."""
    config = StubConfig(fail_first_n=12, fail_first_kind="429", retry_after_s=0.01)
    with StubServer(config) as server:
        async with OpenAIClient(server.base_url, max_retries=0) as client:
            start = time.perf_counter()
            response = await client.chat(model="stub", messages=_user("ANSWER_HINT: 4"))
            elapsed = time.perf_counter() - start
        assert (server.stats["429"], server.stats["ok"]) == (12, 1)
    assert response.message["content"] == "<answer>4</answer>"
    # each wait is at least RATE_LIMIT_MIN_WAIT_S (a Retry-After of 0.01 s is not a hot loop)
    assert elapsed >= 12 * RATE_LIMIT_MIN_WAIT_S


@pytest.mark.parametrize(
    ("statuses", "ends_with"),
    [
        ([429, 500, 429, 503, 429, 500, 429, 200], 200),
        ([429, 500, 429, 503, 429, 500, 429, 502, 200], 502),
    ],
)
async def test_rate_limits_and_server_errors_are_counted_separately(
    statuses: list[int], ends_with: int
) -> None:
    """max_retries counts the 5xx alone: 3 of them between 4 rate limits pass with
    max_retries=3, and a 4th 5xx fails, saying the retries ran out."""
    answers = iter(statuses)
    seen: list[int] = []

    async def handler(request: web.Request) -> web.Response:
        status = next(answers)
        seen.append(status)
        if status == 200:
            body = orjson.dumps({"choices": [{"message": {"content": "ok"}}]})
            return web.Response(body=body, content_type="application/json")
        headers = {"Retry-After": "0"} if status == 429 else {}
        return web.Response(status=status, body=b"busy", headers=headers)

    policy = RetryPolicy(max_retries=3, base_delay_s=0.001)
    async with _http_server(handler) as url, OpenAIClient(url, backoff=policy) as client:
        if ends_with == 200:
            response = await client.chat(model="m", messages=_user("x"))
            assert response.message["content"] == "ok"
        else:
            with pytest.raises(InternalServerError) as info:
                await client.chat(model="m", messages=_user("x"))
            assert str(info.value) == "HTTP 502 Bad Gateway: busy; retried 3 times (max_retries)"
    assert seen[-1] == ends_with


async def test_rate_limit_waits_stop_at_max_retry_wait_s() -> None:
    config = StubConfig(fail_first_n=1000, fail_first_kind="429", retry_after_s=0.2)
    with StubServer(config) as server:
        async with OpenAIClient(server.base_url, max_retry_wait_s=0.9) as client:
            start = time.perf_counter()
            with pytest.raises(RateLimitError) as info:
                await client.chat(model="stub", messages=_user("x"))
            elapsed = time.perf_counter() - start
        requests = server.stats["requests"]
    # waits of 0.2-0.24 s: 3 fit in 0.9 s, a 4th may (then the 5th answer ends it)
    assert 4 <= requests <= 5  # the budget, counted: without it 1,000 429s are waited out
    assert elapsed >= 0.6
    message = str(info.value)
    assert message.startswith(
        "HTTP 429 Too Many Requests: Rate limit reached (stub) (code: rate_limit_exceeded); "
    )
    assert "not waiting the 0.2 s asked: over max_retry_wait_s (0.9 s;" in message


async def test_a_wait_longer_than_the_budget_fails_at_once() -> None:
    """A spent daily quota (Retry-After: an hour) fails now, not in five minutes."""
    config = StubConfig(fail_first_n=1000, fail_first_kind="429", retry_after_s=3600)
    with StubServer(config) as server:
        async with OpenAIClient(server.base_url) as client:  # the default budget
            start = time.perf_counter()
            with pytest.raises(RateLimitError, match=r"not waiting the 3600 s asked"):
                await client.chat(model="stub", messages=_user("x"))
            assert time.perf_counter() - start < 60  # not the hour asked for
        assert server.stats["requests"] == 1


async def test_openai_rate_limit_reset_headers_name_the_wait() -> None:
    """OpenAI's 429 may say when its limit resets (x-ratelimit-reset-*) instead of
    Retry-After: that is waited out too, not counted as a retry."""
    ok = orjson.dumps({"choices": [{"message": {"content": "ok"}}]})
    times: list[float] = []

    async def handler(request: web.Request) -> web.Response:
        times.append(time.perf_counter())
        if len(times) == 1:
            headers = {
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "300ms",
                "x-ratelimit-remaining-tokens": "5000",
                "x-ratelimit-reset-tokens": "1m0s",  # not the exhausted limit
            }
            return web.Response(status=429, body=b"slow down", headers=headers)
        return web.Response(body=ok, content_type="application/json")

    async with _http_server(handler) as url, OpenAIClient(url, max_retries=0) as client:
        response = await client.chat(model="m", messages=_user("x"))
    assert response.message["content"] == "ok"
    # the requests' reset (300 ms), not the tokens' (a minute); the upper bound only has
    # to tell the two apart, with room for a busy machine
    assert 0.3 <= times[1] - times[0] < 30


async def test_connection_refused_retried_then_raises() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    policy = RetryPolicy(max_retries=2, base_delay_s=0.001)
    async with OpenAIClient(url, backoff=policy) as client:
        with pytest.raises(APIConnectionError) as info:
            await client.chat(model="stub", messages=_user("x"))
    assert isinstance(info.value, ConnectionError)
    assert not isinstance(info.value, APITimeoutError)
    assert str(info.value).startswith(f"POST {url}/chat/completions: ClientConnectorError: ")


async def test_random_faults_all_recovered() -> None:
    config = StubConfig(rate_429=0.1, rate_500=0.1, rate_malformed=0.1, retry_after_s=0, seed=3)
    with StubServer(config) as server:
        policy = RetryPolicy(max_retries=10, base_delay_s=0.001, max_delay_s=0.01)
        async with OpenAIClient(server.base_url, backoff=policy) as client:
            results = await asyncio.gather(
                *(
                    client.chat(model="stub", messages=_user(f"ANSWER_HINT: {i}"))
                    for i in range(200)
                )
            )
        stats = server.stats
    assert [r.message["content"] for r in results] == [f"<answer>{i}</answer>" for i in range(200)]
    assert stats["ok"] == 200
    assert stats["429"] + stats["500"] + stats["malformed"] > 20


async def test_500_concurrent_requests_complete() -> None:
    with StubServer(StubConfig(latency_ms=100, reply_mode="arithmetic")) as server:
        async with OpenAIClient(server.base_url, backoff=FAST) as client:
            results = await asyncio.gather(
                *(client.chat(model="stub", messages=_user(f"What is {i} + 1?"))
                  for i in range(500))
            )  # fmt: skip
        stats = server.stats
    assert stats["requests"] == 500
    # concurrent, not queued behind a small pool (counted by the server, not timed)
    assert stats["max_in_flight"] >= 100, stats["max_in_flight"]
    for i, response in enumerate(results):
        assert response.message["content"].endswith(f"<answer>{i + 1}</answer>")


def test_repr_hides_api_key() -> None:
    client = OpenAIClient("http://127.0.0.1:1/v1", "sk-very-secret-key")
    assert "sk-very-secret-key" not in repr(client)
    assert "sk-very-secret-key" not in str(client)
    assert "***" in repr(client)


def test_backoff_and_max_retries_are_exclusive() -> None:
    with pytest.raises(ValueError, match="not both"):
        OpenAIClient("http://127.0.0.1:1/v1", max_retries=2, backoff=FAST)
    with pytest.raises(ValueError, match="http:// or https://"):
        OpenAIClient("localhost:8000/v1")


def test_parse_chat_completion_shapes() -> None:
    parsed = parse_chat_completion(
        b'{"choices":[{"message":{"content":"hi","tool_calls":[{"id":"c","function":'
        b'{"name":"f","arguments":{"x":1}}}]},"finish_reason":"tool_calls"}]}'
    )
    assert parsed.message == {
        "role": "assistant",
        "content": "hi",
        "tool_calls": [{"id": "c", "type": "function",
                        "function": {"name": "f", "arguments": '{"x":1}'}}],
    }  # fmt: skip
    assert parsed.prompt_tokens == 0
    for bad in (b"{", b'{"choices": []}', b'{"error": {"message": "boom"}}', b"[]"):
        with pytest.raises(MalformedResponseError):
            parse_chat_completion(bad)


def _status_error(status: int, error: Any) -> APIStatusError:
    """The error a response with OpenAI's ``{"error": ...}`` body becomes."""
    return error_from_response(status, orjson.dumps({"error": error}))


def test_context_error_detection() -> None:
    vllm = {"message": "This model's maximum context length is 4096 tokens. However, you "
            "requested 5000 tokens", "type": "BadRequestError", "code": 400}  # fmt: skip
    openai_shape = {"message": "too long", "code": "context_length_exceeded"}
    other = {"message": "Invalid value for 'temperature'", "code": "invalid_value"}
    assert is_context_error(_status_error(400, vllm))
    assert is_context_error(_status_error(400, openai_shape))
    assert not is_context_error(_status_error(400, other))
    assert not is_context_error(_status_error(500, vllm))
    plain = error_from_response(413, b"Request prompt is too long for this deployment")
    assert is_context_error(plain)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'"model overloaded"', "HTTP 503: model overloaded"),
        (b'{"error": {"type": "server_error"}}', 'HTTP 503: {"type":"server_error"}'),
        (b'{"error": "upstream\\nfailed"}', "HTTP 503: upstream failed"),
        (b'{"detail": "Not authenticated"}', "HTTP 503: Not authenticated"),
        (b"[1, 2]", "HTTP 503: [1,2]"),
        (b"  \n", "HTTP 503"),
    ],
)
def test_error_body_shapes(content: bytes, expected: str) -> None:
    assert str(error_from_response(503, content)) == expected


# --------------------------------------------------------------------------- errors over HTTP


def _http_server(handler: Handler) -> AbstractAsyncContextManager[str]:
    """A real HTTP server on loopback (in this event loop) answering chat
    completions with ``handler``; yields its base URL."""
    return loopback_server({("POST", "/v1/chat/completions"): handler})


def _replying(
    status: int, body: bytes, content_type: str = "application/json", **headers: str
) -> tuple[Handler, list[web.Request]]:
    seen: list[web.Request] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request)
        return web.Response(status=status, body=body, content_type=content_type, headers=headers)

    return handler, seen


def _openai_error(message: str, type_: str, code: str | int | None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})


LONG_HTML = b"<html><body><h1>502 Bad Gateway</h1>" + b"<p>upstream</p>" * 200 + b"</body></html>"


@pytest.mark.parametrize(
    ("status", "body", "content_type", "cls", "expected", "attempts"),
    [
        (400, _openai_error("The model `gpt-5` does not exist.", "NotFoundError", 404),
         "application/json", BadRequestError,
         "HTTP 400 Bad Request: The model `gpt-5` does not exist.", 1),
        (403, _openai_error("Project does not have access to model o3", "invalid_request_error",
                            "model_not_found"), "application/json", PermissionDeniedError,
         "HTTP 403 Forbidden: Project does not have access to model o3 (code: model_not_found)",
         1),
        (404, b"404: Not Found", "text/plain", NotFoundError, "HTTP 404 Not Found: 404: Not Found",
         1),
        (409, b'{"error": "run already exists"}', "application/json", ConflictError,
         "HTTP 409 Conflict: run already exists", 1),
        (413, b"request entity too large", "text/plain", RequestTooLargeError,
         "HTTP 413 Request Entity Too Large: request entity too large", 1),
        (422, b'{"detail": [{"loc": ["body", "model"], "msg": "Field required"}]}',
         "application/json", UnprocessableEntityError,
         'HTTP 422 Unprocessable Entity: [{"loc":["body","model"],"msg":"Field required"}]', 1),
        (418, b"", "text/plain", APIStatusError, "HTTP 418 I'm a Teapot", 1),
        (429, _openai_error("You exceeded your current quota", "insufficient_quota",
                            "insufficient_quota"), "application/json", RateLimitError,
         "HTTP 429 Too Many Requests: You exceeded your current quota (code: insufficient_quota)",
         2),
        (503, b'{"message": "model is loading"}', "application/json", InternalServerError,
         "HTTP 503 Service Unavailable: model is loading", 2),
    ],
)  # fmt: skip
async def test_error_kinds_carry_the_servers_explanation(
    status: int, body: bytes, content_type: str, cls: type[APIStatusError], expected: str,
    attempts: int,
) -> None:  # fmt: skip
    handler, seen = _replying(status, body, content_type)
    policy = RetryPolicy(max_retries=1, base_delay_s=0.001)
    async with _http_server(handler) as url, OpenAIClient(url, backoff=policy) as client:
        with pytest.raises(APIStatusError) as info:
            await client.chat(model="gpt-5", messages=_user("x"))
    assert type(info.value) is cls
    # a retried error also says how its retries ended
    assert str(info.value) == expected + ("; retried 1 times (max_retries)" if attempts > 1 else "")
    assert info.value.status_code == status
    assert status_of(info.value) == status
    assert len(seen) == attempts  # 429 and 5xx retried once, other 4xx not at all


async def test_plain_text_error_body_is_one_truncated_line() -> None:
    handler, _ = _replying(502, LONG_HTML, "text/html")
    async with _http_server(handler) as url, OpenAIClient(url, max_retries=0) as client:
        with pytest.raises(InternalServerError) as info:
            await client.chat(model="m", messages=_user("x"))
    message = str(info.value)
    assert message.startswith("HTTP 502 Bad Gateway: <html><body><h1>502 Bad Gateway</h1><p>")
    assert message.endswith("…")
    assert "\n" not in message
    assert len(info.value.message) == 500
    assert info.value.body == LONG_HTML.decode()


async def test_redirect_is_an_error_naming_the_location() -> None:
    handler, seen = _replying(301, b"", "text/plain", Location="https://api.example.com/v1")
    async with _http_server(handler) as url, OpenAIClient(url, backoff=FAST) as client:
        with pytest.raises(APIStatusError) as info:
            await client.chat(model="m", messages=_user("x"))
    assert len(seen) == 1  # not followed: a 301 turns a POST into a GET
    assert str(info.value) == (
        "HTTP 301 Moved Permanently: redirected to https://api.example.com/v1; "
        "use that as the base URL."
    )


async def test_request_headers_and_body_on_the_wire() -> None:
    ok = orjson.dumps({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]})
    handler, seen = _replying(200, ok)
    bodies: list[bytes] = []

    async def recording(request: web.Request) -> web.StreamResponse:
        bodies.append(await request.read())
        return await handler(request)

    # a trailing slash on the base URL is fine
    async with _http_server(recording) as url, OpenAIClient(url + "/", "sk-abc") as client:
        response = await client.chat(
            model="m", messages=_user("x"),
            sampling_args={"temperature": 0.5, "extra_headers": {"X-Trace": "t1"}},
        )  # fmt: skip
    assert response.message == {"role": "assistant", "content": "hi"}
    headers = seen[0].headers
    assert seen[0].path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer sk-abc"
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Trace"] == "t1"
    assert headers["User-Agent"].startswith("vfops/")
    assert orjson.loads(bodies[0]) == {"model": "m", "messages": _user("x"), "temperature": 0.5}


def _retry_after_date(seconds: int) -> str:
    return format_datetime(datetime.now(UTC) + timedelta(seconds=seconds), usegmt=True)


@pytest.mark.parametrize(
    ("headers", "minimum_s"),
    [
        (lambda: {"Retry-After-Ms": "300"}, 0.3),
        (lambda: {"Retry-After": _retry_after_date(2)}, 1.0),  # an HTTP date: 1 s resolution
    ],
)
async def test_retry_after_header_forms_are_honoured(
    headers: Callable[[], dict[str, str]], minimum_s: float
) -> None:
    ok = orjson.dumps({"choices": [{"message": {"content": "ok"}}]})
    times: list[float] = []

    async def handler(request: web.Request) -> web.Response:
        times.append(time.perf_counter())
        if len(times) == 1:
            return web.Response(status=429, body=b"slow down", headers=headers())
        return web.Response(body=ok, content_type="application/json")

    async with _http_server(handler) as url, OpenAIClient(url, backoff=FAST) as client:
        response = await client.chat(model="m", messages=_user("x"))
    assert response.message["content"] == "ok"
    assert len(times) == 2
    assert minimum_s <= times[1] - times[0] < minimum_s + 2.0


async def test_malformed_success_body_exhausts_retries() -> None:
    handler, seen = _replying(200, b'{"error": {"message": "overloaded"}}')
    policy = RetryPolicy(max_retries=1, base_delay_s=0.001)
    async with _http_server(handler) as url, OpenAIClient(url, backoff=policy) as client:
        with pytest.raises(MalformedResponseError, match="overloaded"):
            await client.chat(model="m", messages=_user("x"))
    assert len(seen) == 2


class CountingLimiter:
    """A RequestLimiter that records every acquisition and what is in flight."""

    def __init__(self) -> None:
        self.entered = 0
        self.exited = 0
        self.max_in_flight = 0

    def acquire(self) -> AbstractAsyncContextManager[None]:
        return self._slot()

    @asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        self.entered += 1
        self.max_in_flight = max(self.max_in_flight, self.entered - self.exited)
        try:
            yield
        finally:
            self.exited += 1


async def test_limiter_is_entered_around_every_attempt() -> None:
    limiter = CountingLimiter()
    assert isinstance(limiter, RequestLimiter)
    with StubServer(StubConfig(fail_first_n=2, fail_first_kind="500")) as server:
        async with OpenAIClient(server.base_url, backoff=FAST, limiter=limiter) as client:
            response = await client.chat(model="stub", messages=_user("x"))
            assert (limiter.entered, limiter.exited) == (3, 3)  # two failures and the success
            assert limiter.max_in_flight == 1  # released before each backoff sleep
        assert server.stats["requests"] == 3
    assert response.message["content"] == "ok"
    handler, _ = _replying(400, _openai_error("bad", "invalid_request_error", None))
    async with (
        _http_server(handler) as url,
        OpenAIClient(url, backoff=FAST, limiter=limiter) as client,
    ):
        with pytest.raises(BadRequestError):  # a non-retryable error releases it too
            await client.chat(model="m", messages=_user("x"))
    assert (limiter.entered, limiter.exited) == (4, 4)


def test_status_errors_pickle_with_their_fields() -> None:
    exc = error_from_response(
        429, _openai_error("slow down", "requests", "rate_limit_exceeded"), reason="Too Many",
        retry_after_s=1.5,
    )  # fmt: skip
    clone = pickle.loads(pickle.dumps(exc))
    assert type(clone) is RateLimitError
    assert str(clone) == str(exc) == "HTTP 429 Too Many: slow down (code: rate_limit_exceeded)"
    assert (clone.status_code, clone.code, clone.retry_after_s) == (429, "rate_limit_exceeded", 1.5)
    assert retry_after_of(clone) == 1.5
    timeout = pickle.loads(pickle.dumps(APITimeoutError("POST u: no response within 1 s")))
    assert isinstance(timeout, APITimeoutError) and str(timeout) == "POST u: no response within 1 s"
    assert issubclass(APIStatusError, APIError) and issubclass(APIConnectionError, APIError)


async def test_proxy_from_environment_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    ok = orjson.dumps({"choices": [{"message": {"content": "via proxy"}}]})
    handler, seen = _replying(200, ok)
    async with _http_server(handler) as proxy_url:
        monkeypatch.setenv("HTTP_PROXY", proxy_url.removesuffix("/v1"))
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        async with OpenAIClient("http://model-host.invalid/v1") as client:
            response = await client.chat(model="m", messages=_user("x"))
        monkeypatch.setenv("NO_PROXY", "model-host.invalid")
        async with OpenAIClient("http://model-host.invalid/v1", max_retries=0) as client:
            with pytest.raises(APIConnectionError):  # exempt: resolved directly, and fails
                await client.chat(model="m", messages=_user("x"))
    assert response.message["content"] == "via proxy"
    assert len(seen) == 1
    assert seen[0].headers["Host"] == "model-host.invalid"


def test_judge_retries_treat_client_errors_as_transient() -> None:
    from vfops.rubrics._judge import is_transient_error

    assert is_transient_error(APITimeoutError("slow"))
    assert is_transient_error(APIConnectionError("refused"))
    assert is_transient_error(_status_error(429, {})) and is_transient_error(_status_error(503, {}))
    assert not is_transient_error(_status_error(400, {}))


# --------------------------------------------------------------------------- retry policy


def test_retry_policy_classification() -> None:
    policy = RetryPolicy()
    for status in (408, 429, 500, 502, 503, 504):
        assert policy.is_retryable(_status_error(status, {})), status
    for status in (400, 401, 403, 404, 409, 413, 422):
        assert not policy.is_retryable(_status_error(status, {})), status
    assert policy.is_retryable(APITimeoutError("slow"))
    assert policy.is_retryable(APIConnectionError("refused"))
    assert policy.is_retryable(MalformedResponseError("bad json"))
    assert policy.is_retryable(aiohttp.ServerDisconnectedError())
    assert policy.is_retryable(TimeoutError())
    assert policy.is_retryable(ConnectionResetError())
    assert not policy.is_retryable(ValueError("bug"))
    assert not policy.is_retryable(PromptTooLongError("long"))


def test_retry_policy_backoff_full_jitter_capped() -> None:
    policy = RetryPolicy(max_retries=10, base_delay_s=0.5, max_delay_s=4.0, rng=random.Random(1))
    for attempt in range(10):
        cap = min(4.0, 0.5 * 2**attempt)
        delays = [policy.delay_for(attempt) for _ in range(200)]
        assert all(0.0 <= d <= cap for d in delays)
        assert max(delays) > cap * 0.8  # full jitter spans the range
        assert min(delays) < cap * 0.2
    assert policy.backoff_cap(1000) == 4.0


def test_retry_policy_honours_retry_after() -> None:
    policy = RetryPolicy(base_delay_s=0.01, max_delay_s=30.0, rng=random.Random(0))
    assert policy.delay_for(0, retry_after_s=2.5) == 2.5
    assert policy.delay_for(0, retry_after_s=600.0) == 30.0  # capped
    assert policy.delay_for(0, retry_after_s=0.0) <= 0.01
    with pytest.raises(ValueError):
        RetryPolicy(max_retries=-1)


def test_retry_state_waits_rate_limits_within_the_budget() -> None:
    policy = RetryPolicy(max_retries=1, base_delay_s=0.01, max_retry_wait_s=10.0,
                         rng=random.Random(0))  # fmt: skip
    state = RetryState(policy)
    limited = error_from_response(429, b"", retry_after_s=2.0)
    delays = [state.delay_after(limited) for _ in range(4)]
    # never sooner than asked, at most RATE_LIMIT_JITTER later; the 5th would pass 10 s
    assert all(d is not None and 2.0 <= d <= 2.0 * (1 + RATE_LIMIT_JITTER) for d in delays)
    assert state.delay_after(limited) is None
    assert state.gave_up_because.startswith("not waiting the 2 s asked: over max_retry_wait_s")
    assert (state.retries, state.rate_limited) == (0, 4)
    # the 5xx budget is untouched by the rate limits
    assert state.delay_after(_status_error(500, {})) is not None
    assert state.delay_after(_status_error(500, {})) is None
    assert state.gave_up_because == "retried 1 times (max_retries)"
    # a 429 without a wait, and anything not retryable
    assert RetryState(RetryPolicy(max_retries=0)).delay_after(_status_error(429, {})) is None
    assert RetryState(policy).delay_after(_status_error(400, {})) is None
    with pytest.raises(ValueError, match="max_retry_wait_s"):
        RetryPolicy(max_retry_wait_s=float("nan"))


def test_parse_rate_limit_reset() -> None:
    h = CIMultiDict
    assert parse_duration("20ms") == pytest.approx(0.02)
    assert parse_duration("1.5s") == 1.5
    assert parse_duration("6m0s") == 360.0
    assert parse_duration("1h2m3s") == 3723.0
    assert parse_duration("7") == 7.0
    assert parse_duration("soon") is None and parse_duration("5x") is None
    assert parse_rate_limit_reset(None) is None
    assert parse_rate_limit_reset(h({})) is None
    tokens_out = {
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "6m0s",
        "x-ratelimit-remaining-requests": "99",
        "x-ratelimit-reset-requests": "1s",
    }
    assert parse_rate_limit_reset(h(tokens_out)) == 360.0
    assert parse_rate_limit_reset(h({"x-ratelimit-reset-requests": "250ms"})) == 0.25


def test_parse_retry_after() -> None:
    h = CIMultiDict  # what aiohttp gives: case-insensitive
    assert parse_retry_after(None) is None
    assert parse_retry_after(h({})) is None
    assert parse_retry_after(h({"Retry-After": "3"})) == 3.0
    assert parse_retry_after(h({"retry-after": "0.25"})) == 0.25
    assert parse_retry_after(h({"Retry-After-Ms": "1500", "Retry-After": "9"})) == 1.5
    now = datetime(2030, 1, 1, tzinfo=UTC)
    date = format_datetime(now + timedelta(seconds=20), usegmt=True)
    assert parse_retry_after(h({"Retry-After": date}), now=now.timestamp()) == 20.0
    past = format_datetime(now - timedelta(seconds=20), usegmt=True)
    assert parse_retry_after(h({"Retry-After": past}), now=now.timestamp()) == 0.0
    assert parse_retry_after(h({"Retry-After": "soon"})) is None


# --------------------------------------------------------------------------- endpoints

GOOD = """
[[endpoint]]
alias = "small"
model = "gpt-4.1-mini"
base_url = "https://api.openai.com/v1"
api_key_var = "OPENAI_API_KEY"

[[endpoint]]
alias = "local"
model = "Qwen/Qwen3-0.6B"
base_url = "http://localhost:8000/v1"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "endpoints.toml"
    path.write_text(text)
    return path


def test_load_endpoints(tmp_path: Path) -> None:
    endpoints = load_endpoints(_write(tmp_path, GOOD))
    assert endpoints == {
        "small": Endpoint("small", "gpt-4.1-mini", "https://api.openai.com/v1", "OPENAI_API_KEY"),
        "local": Endpoint("local", "Qwen/Qwen3-0.6B", "http://localhost:8000/v1",
                          "OPENAI_API_KEY"),
    }  # fmt: skip
    assert load_endpoints(_write(tmp_path, "")) == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[[endpoint]\nalias = 1", "invalid TOML at line 1, column 11: "),
        ('[[endpoint]]\nalias = "a"\nbase_url = "http://h/v1"',
         "[[endpoint]] #1.model: missing; this field is required"),
        ('[[endpoint]]\nmodel = "m"\nbase_url = "http://h/v1"', "[[endpoint]] #1.alias: missing"),
        ('[[endpoint]]\nalias = "a"\nmodel = "m"', "[[endpoint]] #1.base_url: missing"),
        (GOOD + '\n[[endpoint]]\nalias = "small"\nmodel = "x"\nbase_url = "http://h/v1"',
         "duplicate alias 'small' ([[endpoint]] #1 and #3); aliases must be unique"),
        ('[[endpoint]]\nalias = "a"\nmodel = "m"\nbase_url = "http://h/v1"\nurl = "x"',
         "[[endpoint]] #1.url: unknown key; valid keys: alias, model, base_url, api_key_var"),
        ('[[endpoint]]\nalias = "a"\nmodel = 3\nbase_url = "http://h/v1"',
         "[[endpoint]] #1.model: must be a quoted string"),
        ('[[endpoint]]\nalias = "a"\nmodel = "  "\nbase_url = "http://h/v1"',
         "[[endpoint]] #1.model: must be a non-empty string"),
        ('[[endpoint]]\nalias = "a"\nmodel = "m"\nbase_url = "localhost:8000"',
         "[[endpoint]] #1.base_url: 'localhost:8000' is not an http(s) URL"),
        ('[[endpoint]]\nalias = "a"\nmodel = "m"\nbase_url = "http://h/v1"\n'
         'api_key_var = "OPENAI API KEY"', "must be the NAME of an environment variable"),
        ('endpoint = "x"', "endpoint: must be an array of tables: write [[endpoint]] tables"),
        ('[[endpoints]]\nalias = "a"', "endpoints: unknown key; did you mean 'endpoint'?"),
    ],
)  # fmt: skip
def test_load_endpoints_errors(tmp_path: Path, text: str, expected: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(EndpointError) as info:
        load_endpoints(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert expected in message
    assert "\n" not in message


def test_literal_api_key_is_rejected_without_echoing_it(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '[[endpoint]]\nalias = "a"\nmodel = "m"\nbase_url = "http://h/v1"\n'
        'api_key = "sk-live-abcdef"\n',
    )
    literal = r"#1\.api_key: a literal api_key is not allowed"
    with pytest.raises(EndpointError, match=literal) as info:
        load_endpoints(path)
    assert "sk-live-abcdef" not in str(info.value)
    path = _write(
        tmp_path,
        '[[endpoint]]\nalias = "a"\nmodel = "m"\nbase_url = "http://h/v1"\n'
        'api_key_var = "sk-live-abcdef"\n',
    )
    with pytest.raises(EndpointError, match="NAME of an environment variable") as info:
        load_endpoints(path)
    assert "sk-live-abcdef" not in str(info.value)


def test_missing_endpoints_file(tmp_path: Path) -> None:
    with pytest.raises(EndpointError, match="not found"):
        load_endpoints(tmp_path / "nope.toml")


def test_resolve_endpoint(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    assert resolve_endpoint("small", endpoints_file=path) == Endpoint(
        "small", "gpt-4.1-mini", "https://api.openai.com/v1", "OPENAI_API_KEY"
    )
    # explicit flags win over the alias
    assert resolve_endpoint(
        "small", endpoints_file=path, base_url="http://127.0.0.1:9/v1", api_key_var="MY_KEY"
    ) == Endpoint("small", "gpt-4.1-mini", "http://127.0.0.1:9/v1", "MY_KEY")
    # a literal model with an explicit base URL
    assert resolve_endpoint(
        "my-model", endpoints_file=path, base_url="http://127.0.0.1:9/v1"
    ) == Endpoint("my-model", "my-model", "http://127.0.0.1:9/v1", "OPENAI_API_KEY")
    # no file, no base URL: the OpenAI API
    assert resolve_endpoint("gpt-4.1") == Endpoint(
        "gpt-4.1", "gpt-4.1", "https://api.openai.com/v1", "OPENAI_API_KEY"
    )
    with pytest.raises(EndpointError, match="unknown model alias 'smol'") as info:
        resolve_endpoint("smol", endpoints_file=path)
    assert "known aliases: local, small" in str(info.value)
    with pytest.raises(EndpointError, match="--base-url"):
        resolve_endpoint("m", base_url="ftp://x")
    with pytest.raises(EndpointError, match="--api-key-var"):
        resolve_endpoint("m", api_key_var="sk-abc-123")


def test_read_api_key_only_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    remote = Endpoint("small", "gpt-4.1-mini", "https://api.openai.com/v1", "VFOPS_TEST_KEY")
    monkeypatch.setenv("VFOPS_TEST_KEY", "sk-from-env")
    assert read_api_key(remote, required=True) == "sk-from-env"
    monkeypatch.delenv("VFOPS_TEST_KEY")
    with pytest.raises(EndpointError) as info:
        read_api_key(remote, required=True)
    assert str(info.value) == (
        "environment variable VFOPS_TEST_KEY is not set; "
        "export VFOPS_TEST_KEY=... or pass --api-key-var"
    )
    assert read_api_key(remote, required=False) == "EMPTY"

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    for url in ("http://localhost:8000/v1", "http://127.0.0.1:8000/v1", "http://[::1]:8000/v1"):
        local = Endpoint("local", "m", url)
        assert read_api_key(local, required=True) == "EMPTY"
    # a non-default variable is required even for loopback
    with pytest.raises(EndpointError, match="VFOPS_TEST_KEY"):
        read_api_key(Endpoint("l", "m", "http://localhost:1/v1", "VFOPS_TEST_KEY"), required=True)
    with pytest.raises(EndpointError, match="OPENAI_API_KEY"):
        read_api_key(Endpoint("r", "m", "https://example.com/v1"), required=True)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    assert read_api_key(Endpoint("local", "m", "http://localhost:8000/v1"), required=True) == (
        "sk-local"
    )


async def test_check_reachable() -> None:
    with StubServer() as server:
        await check_reachable(server.base_url)
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(EndpointError) as info:
        await check_reachable(url, timeout_s=2)
    message = str(info.value)
    assert message.startswith(f"cannot reach base URL {url}: ")
    assert message.endswith("; check --base-url and that the server is running")
    with pytest.raises(EndpointError, match="not an http"):
        await check_reachable("localhost:8000")
