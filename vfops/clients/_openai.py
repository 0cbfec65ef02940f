"""A :class:`ModelClient` for any OpenAI-compatible chat-completions endpoint.

Built on ``openai.AsyncOpenAI`` with the SDK's own retries disabled; retries
follow :class:`RetryPolicy` so the behaviour is explicit and tested. The request
body is serialised with orjson and sent through the SDK's low-level ``post``
(auth, headers, base URL and error mapping stay the SDK's), and the response
body is decoded with orjson into plain dicts: no pydantic models per request,
which keeps client CPU well under a millisecond per call (see
``bench/client_transport.py``).
"""

from __future__ import annotations

import asyncio
import logging
import re
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol, runtime_checkable

import httpx2
import openai
import orjson

from vfops._types import Message, Messages, SamplingArgs
from vfops.clients._base import ChatResponse, PromptTooLongError
from vfops.clients._retry import MalformedResponseError, RetryPolicy, retry_after_of

log = logging.getLogger("vfops.clients")

Transport = Literal["aiohttp", "httpx"]

DEFAULT_MAX_CONNECTIONS = 8192
"""Connection-pool size: enough for thousands of concurrent rollouts per client
(lowered to half the open-file limit, so a full pool queues instead of failing)."""


@runtime_checkable
class RequestLimiter(Protocol):
    """Admission control wrapped around each HTTP attempt of :class:`OpenAIClient`.

    ``acquire()`` returns an async context manager entered right before a request is
    sent and exited when its response (or error) is in, so every attempt, retries
    included, takes one unit of a rate budget and holds one concurrency slot while
    in flight. The client's backoff sleeps happen outside it. Implementations:
    :class:`vfops.budget.LocalRequestLimiter`, :class:`vfops.budget.PrefectRequestLimiter`.
    """

    def acquire(self) -> AbstractAsyncContextManager[None]: ...


def default_max_connections() -> int:
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return DEFAULT_MAX_CONNECTIONS
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(64, min(DEFAULT_MAX_CONNECTIONS, soft // 2))


_CONTEXT_RE = re.compile(
    r"context[ _]length|context window|maximum context|too many tokens|prompt is too long"
    r"|input is too long|reduce the length|exceeds the model|longer than the model",
    re.IGNORECASE,
)


def _is_context_error(exc: openai.APIStatusError) -> bool:
    if exc.status_code not in (400, 413, 422):
        return False
    if exc.code == "context_length_exceeded":
        return True
    body = exc.body
    text = exc.message
    if isinstance(body, dict):
        text = f"{text} {body.get('message', '')} {body.get('code', '')}"
    elif isinstance(body, str):
        text = f"{text} {body}"
    return _CONTEXT_RE.search(text) is not None


def _normalize_tool_calls(raw: Any) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for tc in raw:
        fn = tc.get("function") or {}
        arguments = fn.get("arguments")
        if not isinstance(arguments, str):
            arguments = orjson.dumps(arguments if arguments is not None else {}).decode()
        calls.append(
            {
                "id": tc.get("id"),
                "type": tc.get("type") or "function",
                "function": {"name": fn.get("name"), "arguments": arguments},
            }
        )
    return calls


def parse_chat_completion(body: bytes) -> ChatResponse:
    """Decode a chat-completion response body into a :class:`ChatResponse`.

    Raises :class:`MalformedResponseError` (retryable) for bad JSON or a body
    without ``choices[0].message``.
    """
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedResponseError(f"response body is not valid JSON: {exc}") from None
    try:
        choice = data["choices"][0]
        raw_message = choice["message"]
        if not isinstance(raw_message, dict):
            raise TypeError("message is not an object")
    except (KeyError, IndexError, TypeError) as exc:
        detail = data.get("error") if isinstance(data, dict) else None
        raise MalformedResponseError(
            f"response has no choices[0].message ({exc!r}); error field: {detail!r}"
        ) from None
    message: Message = {
        "role": raw_message.get("role") or "assistant",
        "content": raw_message.get("content"),
    }
    tool_calls = raw_message.get("tool_calls")
    if tool_calls:
        message["tool_calls"] = _normalize_tool_calls(tool_calls)
    usage = data.get("usage") or {}
    return ChatResponse(
        message=message,
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        raw=data,
    )


def _make_http_client(
    transport: Transport, timeout: httpx2.Timeout, max_connections: int
) -> httpx2.AsyncClient:
    limits = httpx2.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        keepalive_expiry=30.0,
    )
    if transport == "aiohttp":
        return openai.DefaultAioHttpClient(timeout=timeout, limits=limits)
    if transport == "httpx":
        return openai.DefaultAsyncHttpxClient(timeout=timeout, limits=limits)
    raise ValueError(f"transport must be 'aiohttp' or 'httpx', got {transport!r}")


class OpenAIClient:
    """Chat completions against any OpenAI-compatible ``base_url``.

    ``api_key`` is sent as a bearer token and never logged or shown in ``repr``
    (``None`` sends ``EMPTY``, which local servers accept). ``timeout_s`` bounds
    each attempt's connect and read. ``max_retries`` (default 5) or a full
    ``backoff`` :class:`RetryPolicy` — not both — set the retry behaviour.
    ``transport`` picks the HTTP stack: ``"aiohttp"`` (default, lower CPU per
    request) or ``"httpx"``. ``max_connections`` sizes the pool (default 8192, or
    half the open-file limit if lower); requests beyond it wait for a connection.
    ``limiter`` (a :class:`RequestLimiter`) is entered around each HTTP attempt,
    retries included, to keep a shared rate/concurrency budget.
    Create, use and close a client inside one event loop.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 600.0,
        max_retries: int | None = None,
        max_connections: int | None = None,
        transport: Transport = "aiohttp",
        backoff: RetryPolicy | None = None,
        limiter: RequestLimiter | None = None,
    ) -> None:
        if backoff is not None and max_retries is not None:
            raise ValueError("pass either max_retries or backoff=RetryPolicy(...), not both")
        self.base_url = base_url
        self.transport: Transport = transport
        self.timeout_s = timeout_s
        self.limiter = limiter
        self.retry = (
            backoff
            if backoff is not None
            else RetryPolicy(max_retries=5 if max_retries is None else max_retries)
        )
        timeout = httpx2.Timeout(timeout_s, connect=min(timeout_s, 30.0), pool=None)
        self._http = _make_http_client(
            transport, timeout, max_connections or default_max_connections()
        )
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or "EMPTY",
            max_retries=0,
            timeout=timeout,
            http_client=self._http,
        )

    def __repr__(self) -> str:
        return (
            f"OpenAIClient(base_url={self.base_url!r}, api_key='***', "
            f"transport={self.transport!r}, timeout_s={self.timeout_s}, retry={self.retry!r})"
        )

    async def chat(
        self,
        *,
        model: str,
        messages: Messages,
        sampling_args: SamplingArgs | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatResponse:
        body: dict[str, Any] = {"model": model, "messages": messages}
        options: openai.RequestOptions = {}  # the SDK's default headers already say JSON
        if sampling_args:
            args = dict(sampling_args)
            extra_body = args.pop("extra_body", None) or {}
            extra_headers = args.pop("extra_headers", None)
            if args.get("n", 1) != 1 or extra_body.get("n", 1) != 1:
                raise ValueError("OpenAIClient.chat returns one message; sampling_args n must be 1")
            if args.get("stream") or extra_body.get("stream"):
                raise ValueError("OpenAIClient.chat does not stream; drop 'stream'")
            body.update(args)
            body.update(extra_body)
            if extra_headers:
                options["headers"] = dict(extra_headers)
        if tools:
            body["tools"] = tools
        payload = orjson.dumps(body)

        policy = self.retry
        limiter = self.limiter
        attempt = 0
        while True:
            try:
                if limiter is None:
                    response = await self._client.post(
                        "/chat/completions",
                        cast_to=httpx2.Response,
                        content=payload,
                        options=options,
                    )
                else:
                    async with limiter.acquire():
                        response = await self._client.post(
                            "/chat/completions",
                            cast_to=httpx2.Response,
                            content=payload,
                            options=options,
                        )
                return parse_chat_completion(response.content)
            except openai.APIStatusError as exc:
                if _is_context_error(exc):
                    raise PromptTooLongError(
                        f"prompt too long for model {model!r}: {exc.message}"
                    ) from exc
                if attempt >= policy.max_retries or not policy.is_retryable(exc):
                    raise
                delay = policy.delay_for(attempt, retry_after_of(exc))
                log.debug(
                    "chat: HTTP %s, retry %d/%d in %.2fs",
                    exc.status_code,
                    attempt + 1,
                    policy.max_retries,
                    delay,
                )
            except Exception as exc:
                if attempt >= policy.max_retries or not policy.is_retryable(exc):
                    raise
                delay = policy.delay_for(attempt, None)
                log.debug(
                    "chat: %s, retry %d/%d in %.2fs",
                    type(exc).__name__,
                    attempt + 1,
                    policy.max_retries,
                    delay,
                )
            await asyncio.sleep(delay)
            attempt += 1

    async def aclose(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
