"""A :class:`ModelClient` for any OpenAI-compatible chat-completions endpoint.

Speaks the wire protocol directly over one pooled aiohttp session
(:class:`~vfops.clients._http.HTTPTransport`): the request body is serialised
with orjson and the response decoded with orjson into plain dicts, so no SDK
request or response models are built per call. That keeps the client side of a
request to a fraction of a millisecond of CPU and ``import vfops.clients`` free of
the ``openai`` SDK (see ``bench/client_transport.py``). Retries follow
:class:`RetryPolicy`, so the behaviour is explicit and tested; errors are the
:mod:`vfops.clients._errors` classes and carry the server's explanation. What is
not HTTP (pricing and cost reservations) is request middleware
(:mod:`vfops.clients._middleware`).
"""

from __future__ import annotations

import asyncio
import logging
import re
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, runtime_checkable

import orjson

from vfops._errors import InvalidArgumentError
from vfops._redact import Redactor, basic_auth, public_url, url_secrets
from vfops._rollout import dumps_escaped
from vfops._types import Message, Messages, SamplingArgs
from vfops.clients._base import ChatResponse, PromptTooLongError
from vfops.clients._errors import APIError, APIStatusError, MalformedResponseError, with_note
from vfops.clients._http import HTTPTransport
from vfops.clients._middleware import ChatRequest, PricedRequests, RequestMiddleware, Send
from vfops.clients._retry import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_MAX_RETRY_WAIT_S,
    DEFAULT_MAX_TIMEOUT_RETRIES,
    RetryPolicy,
    RetryState,
)
from vfops.clients._urls import route_url, split_userinfo
from vfops.costs import Pricing

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
    :class:`vfops.budget.LocalRequestLimiter`, :class:`vfops.orchestration.PrefectRequestLimiter`.
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


def parse_chat_completion(body: bytes, redactor: Redactor | None = None) -> ChatResponse:
    """Decode a chat-completion response body into a :class:`ChatResponse`.

    ``redactor`` (the client's key and URL credentials) is applied to every string of
    the decoded body first: an endpoint that echoes the key (plain, URL-encoded,
    base64...) in its completion hands no store, score or log a copy of it.
    Raises :class:`MalformedResponseError` (retryable) for bad JSON or a body
    without ``choices[0].message``.
    """
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedResponseError(f"response body is not valid JSON: {exc}") from None
    if redactor:
        data = redactor.json(data)
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
    details = usage.get("prompt_tokens_details") or {}
    return ChatResponse(
        message=message,
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0,
        raw=data,
    )


class OpenAIClient:
    """Chat completions against any OpenAI-compatible ``base_url``.

    ``api_key`` is sent as a bearer token and never logged, shown in ``repr`` or
    kept in an error or a response (redacted, in any encoding, from what the server
    answers: some echo it back); ``None`` sends ``EMPTY``, which local servers accept.
    Credentials in ``base_url`` are no exception: ``user:password@`` is sent as basic
    auth instead of a key (both at once is refused: a request has one
    ``Authorization``), a query (``?api-key=...``) goes with every request, and
    neither is in :attr:`base_url`, an error or a response. ``timeout_s`` bounds
    each attempt in wall-clock time, from sending it to the response's last byte.
    ``max_retries`` (default 5: retries of 5xx, timeouts and connection errors),
    ``max_timeout_retries`` (default 2: how many of them may be timeouts) and ``max_retry_wait_s``
    (default 300: seconds of waits one request may spend on 429s that name their
    wait), or a full ``backoff`` :class:`RetryPolicy` — not both — set the retry
    behaviour (see :mod:`vfops.clients._retry`). ``max_connections`` sizes the
    pool (default 8192, or half the open-file limit if lower); requests beyond it
    wait for a connection.
    ``limiter`` (a :class:`RequestLimiter`) is entered around each HTTP attempt,
    retries included, to keep a shared rate/concurrency budget.
    ``pricing`` (a :class:`~vfops.costs.Pricing`) prices each response's usage
    (``ChatResponse.cost_usd``); a priced call inside an evaluation with a cost cap
    first reserves its worst case on the cap's ledger (:mod:`vfops.costs`): the
    :class:`~vfops.clients._middleware.PricedRequests` middleware, installed here.
    Further request middleware goes on with :meth:`use` (the evaluation's peer sync).

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
        max_timeout_retries: int | None = None,
        max_retry_wait_s: float | None = None,
        max_connections: int | None = None,
        backoff: RetryPolicy | None = None,
        limiter: RequestLimiter | None = None,
        pricing: Pricing | None = None,
    ) -> None:
        limits = (max_retries, max_timeout_retries, max_retry_wait_s)
        if backoff is not None and any(limit is not None for limit in limits):
            raise InvalidArgumentError(
                "pass either max_retries/max_timeout_retries/max_retry_wait_s or "
                "backoff=RetryPolicy(...), not both"
            )
        url, userinfo = split_userinfo(base_url)
        if userinfo is not None and api_key and api_key != "EMPTY":
            raise InvalidArgumentError(
                f"base_url {public_url(base_url)} carries user:password@ credentials and an "
                "API key is given too: a request has one Authorization header; drop the "
                "credentials from the URL or the key"
            )
        self.base_url = public_url(base_url)
        """The URL without its credentials (what may be shown or recorded)."""
        self.timeout_s = timeout_s
        self.limiter = limiter
        self.pricing = pricing
        self._middleware: list[RequestMiddleware] = []
        self._chain: Send | None = None
        if pricing is not None:  # every priced client reserves on the evaluation's ledger
            self.use(PricedRequests(pricing))
        if backoff is None:
            backoff = RetryPolicy(
                max_retries=DEFAULT_MAX_RETRIES if max_retries is None else max_retries,
                max_timeout_retries=(
                    DEFAULT_MAX_TIMEOUT_RETRIES
                    if max_timeout_retries is None
                    else max_timeout_retries
                ),
                max_retry_wait_s=(
                    DEFAULT_MAX_RETRY_WAIT_S if max_retry_wait_s is None else max_retry_wait_s
                ),
            )
        self.retry = backoff
        self._url = route_url(url, "chat/completions")
        self._models_url = route_url(url, "models")
        secrets = (*((api_key,) if api_key else ()), *url_secrets(base_url))
        self._http = HTTPTransport(
            url,
            headers={
                "Authorization": (
                    basic_auth(*userinfo) if userinfo else f"Bearer {api_key or 'EMPTY'}"
                ),
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
            timeout_s=timeout_s,
            max_connections=max_connections or default_max_connections(),
            secrets=secrets,
        )
        self._redactor = self._http.redactor

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
                raise InvalidArgumentError(
                    "OpenAIClient.chat returns one message; sampling_args n must be 1"
                )
            if args.get("stream") or extra_body.get("stream"):
                raise InvalidArgumentError("OpenAIClient.chat does not stream; drop 'stream'")
            body.update(args)
            body.update(extra_body)
            if extra_headers:
                headers = dict(extra_headers)
        if tools:
            body["tools"] = tools
        payload = dumps_escaped(body)  # a lone surrogate in a prompt: sent escaped, as recorded
        chain = self._chain
        if chain is None:  # no middleware: nothing between the request and the wire
            return await self._send(model, payload, headers)
        return await chain(ChatRequest(model, messages, sampling_args, tools, payload, headers))

    def use(self, middleware: RequestMiddleware) -> None:
        """Install ``middleware`` around this client's requests (innermost of those
        installed so far); see :mod:`vfops.clients._middleware`."""
        self._middleware.append(middleware)
        self._chain = self._build_chain()

    def remove(self, middleware: RequestMiddleware) -> None:
        """Uninstall ``middleware`` (installed with :meth:`use`)."""
        self._middleware.remove(middleware)
        self._chain = self._build_chain()

    @property
    def middleware(self) -> tuple[RequestMiddleware, ...]:
        """The middleware installed, outermost first."""
        return tuple(self._middleware)

    def _build_chain(self) -> Send | None:
        if not self._middleware:
            return None
        send: Send = self._send_request
        for middleware in reversed(self._middleware):
            send = middleware.wrap(send)
        return send

    async def _send_request(self, request: ChatRequest) -> ChatResponse:
        return await self._send(request.model, request.payload, request.headers)

    async def _send(
        self, model: str, payload: bytes, headers: dict[str, str] | None
    ) -> ChatResponse:
        """POST one request, with retries; the parsed response."""
        retries = RetryState(self.retry)
        limiter = self.limiter
        request = self._http.request
        url = self._url
        while True:
            try:
                if limiter is None:
                    content = await request("POST", url, payload, headers=headers)
                else:
                    async with limiter.acquire():
                        content = await request("POST", url, payload, headers=headers)
                return parse_chat_completion(content, self._redactor)
            except Exception as exc:
                if isinstance(exc, APIStatusError) and is_context_error(exc):
                    raise PromptTooLongError(
                        f"prompt too long for model {model!r}: {exc.message}"
                    ) from exc
                delay = self._retry_delay(retries, exc)
            await asyncio.sleep(delay)

    @staticmethod
    def _retry_delay(retries: RetryState, exc: Exception) -> float:
        """The sleep before retrying after ``exc``; raises it (noting why) when out of retries."""
        delay = retries.delay_after(exc)
        if delay is None:
            if retries.gave_up_because and isinstance(exc, APIError):
                raise with_note(exc, retries.gave_up_because) from exc
            raise exc
        log.debug(
            "chat: %s, retry in %.2fs (%d retries, %d rate limits, %.1fs waited)",
            type(exc).__name__,
            delay,
            retries.retries,
            retries.rate_limited,
            retries.waited_s,
        )
        return delay

    async def list_models(self, *, timeout_s: float = 5.0) -> list[str]:
        """The model ids ``GET {base_url}/models`` lists: one request, not retried.

        Raises :class:`~vfops.clients.APIStatusError` when the server answers
        otherwise (404 where it has no such route, 401 where listing needs other
        rights), :class:`~vfops.clients.APIConnectionError` /
        :class:`~vfops.clients.APITimeoutError`, or :class:`MalformedResponseError`
        when the body is not an OpenAI model list.
        """
        content = await self._http.request("GET", self._models_url, timeout_s=timeout_s)
        try:
            return [str(entry["id"]) for entry in orjson.loads(content)["data"]]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise MalformedResponseError(
                f"GET {self.base_url.rstrip('/')}/models: not a model list "
                f"({type(exc).__name__}: {exc})"
            ) from None

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
