"""A :class:`ModelClient` for any OpenAI-compatible chat-completions endpoint.

Speaks the wire protocol directly over one pooled aiohttp session
(:class:`~vfops.clients._http.HTTPTransport`): the request body is serialised
with orjson and the response decoded with orjson into plain dicts, so no SDK
request or response models are built per call. That keeps the client side of a
request to a fraction of a millisecond of CPU and ``import vfops.clients`` free of
the ``openai`` SDK (see ``bench/client_transport.py``). Retries follow
:class:`RetryPolicy`, so the behaviour is explicit and tested; errors are the
:mod:`vfops.clients._errors` classes and carry the server's explanation.
"""

from __future__ import annotations

import asyncio
import logging
import re
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, runtime_checkable

import orjson

from vfops._types import Message, Messages, SamplingArgs
from vfops.clients._base import ChatResponse, PromptTooLongError
from vfops.clients._errors import APIStatusError, MalformedResponseError
from vfops.clients._http import HTTPTransport
from vfops.clients._retry import RetryPolicy

log = logging.getLogger("vfops.clients")

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


def is_context_error(exc: APIStatusError) -> bool:
    """Whether a 400/413/422 says the prompt does not fit the model's context."""
    if exc.status_code not in (400, 413, 422):
        return False
    if exc.code == "context_length_exceeded":
        return True
    text = f"{exc.message} {exc.code or ''}"
    if isinstance(exc.body, str):
        text = f"{text} {exc.body}"
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


class OpenAIClient:
    """Chat completions against any OpenAI-compatible ``base_url``.

    ``api_key`` is sent as a bearer token and never logged or shown in ``repr``
    (``None`` sends ``EMPTY``, which local servers accept). ``timeout_s`` bounds
    each attempt's connect and wait for the response. ``max_retries`` (default 5)
    or a full ``backoff`` :class:`RetryPolicy` — not both — set the retry
    behaviour. ``max_connections`` sizes the pool (default 8192, or half the
    open-file limit if lower); requests beyond it wait for a connection.
    ``limiter`` (a :class:`RequestLimiter`) is entered around each HTTP attempt,
    retries included, to keep a shared rate/concurrency budget.

    Failures raise :class:`~vfops.clients.APIStatusError` subclasses (with the
    server's message), :class:`~vfops.clients.APITimeoutError`,
    :class:`~vfops.clients.APIConnectionError`,
    :class:`~vfops.clients.MalformedResponseError`, or :class:`PromptTooLongError`
    for a context-length rejection. ``HTTPS_PROXY``/``NO_PROXY`` are honoured.
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
        backoff: RetryPolicy | None = None,
        limiter: RequestLimiter | None = None,
    ) -> None:
        if backoff is not None and max_retries is not None:
            raise ValueError("pass either max_retries or backoff=RetryPolicy(...), not both")
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.limiter = limiter
        self.retry = (
            backoff
            if backoff is not None
            else RetryPolicy(max_retries=5 if max_retries is None else max_retries)
        )
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._http = HTTPTransport(
            base_url,
            headers={
                "Authorization": f"Bearer {api_key or 'EMPTY'}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
            timeout_s=timeout_s,
            max_connections=max_connections or default_max_connections(),
        )

    def __repr__(self) -> str:
        return (
            f"OpenAIClient(base_url={self.base_url!r}, api_key='***', "
            f"timeout_s={self.timeout_s}, retry={self.retry!r})"
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
        headers: dict[str, str] | None = None
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
                headers = dict(extra_headers)
        if tools:
            body["tools"] = tools
        payload = orjson.dumps(body)

        policy = self.retry
        limiter = self.limiter
        request = self._http.request
        url = self._url
        attempt = 0
        while True:
            try:
                if limiter is None:
                    content = await request("POST", url, payload, headers=headers)
                else:
                    async with limiter.acquire():
                        content = await request("POST", url, payload, headers=headers)
                return parse_chat_completion(content)
            except APIStatusError as exc:
                if is_context_error(exc):
                    raise PromptTooLongError(
                        f"prompt too long for model {model!r}: {exc.message}"
                    ) from exc
                if attempt >= policy.max_retries or not policy.is_retryable(exc):
                    raise
                delay = policy.delay_for(attempt, exc.retry_after_s)
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
        await self._http.aclose()

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
