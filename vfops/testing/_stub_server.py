"""An OpenAI-compatible stub server for tests and benchmarks.

Serves ``POST /v1/chat/completions`` (with ``n``; streamed when asked), ``GET /v1/models``
and ``GET /stats`` on aiohttp. Latency is an ``asyncio.sleep``, so one process
holds thousands of concurrent requests; per-request work is a regex and two
orjson calls. Faults are injected by seeded probabilities (``rate_429``,
``rate_500``, ``rate_timeout``, ``rate_malformed``) or deterministically for the
first ``fail_first_n`` requests (``fail_first_kind``). ``rate_limit_per_s`` turns
on a provider-style rate limit: 429 with ``Retry-After`` above R requests in any
sliding 1 s window.

Use it in-process (``with StubServer(config) as server: server.base_url``), in a
subprocess (``StubServer(config, subprocess=True)``), or from the command line
(``python -m vfops.testing.stub_server --port 8000 --latency-ms 200``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import subprocess as _subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import orjson
from aiohttp import web

from vfops._errors import InvalidArgumentError
from vfops.testing._stub_sse import sse_events

ReplyFn = Callable[[dict[str, Any]], dict[str, Any]]
"""``(request_json) -> assistant message dict`` for in-process use."""

FaultKind = Literal["429", "500", "503", "timeout", "malformed", "400", "context"]
FAULT_KINDS: tuple[str, ...] = ("429", "500", "503", "timeout", "malformed", "400", "context")

_HINT_RE = re.compile(r"ANSWER_HINT:\s*(.+)")
_ARITH_RE = re.compile(r"(-?\d+(?:\.\d+)?)\s*([-+*/x×÷])\s*(-?\d+(?:\.\d+)?)")
_JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass
class StubConfig:
    """Behaviour of a :class:`StubServer`. Rates are per-request probabilities."""

    latency_ms: float = 0.0
    reply_mode: str | ReplyFn = "echo_answer"
    """``"echo_answer"``, ``"arithmetic"`` or a callable ``(request_json) -> message``."""
    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_timeout: float = 0.0
    rate_malformed: float = 0.0
    retry_after_s: float | None = 0.05
    """``Retry-After`` header value (seconds) sent with 429s; ``None`` sends no header."""
    timeout_sleep_s: float = 3600.0
    """How long a "timeout" request hangs (far beyond any client timeout) before
    answering 500; a client that hangs up ends it early."""
    fail_first_n: int = 0
    """The first N chat requests fail deterministically with ``fail_first_kind``."""
    fail_first_kind: FaultKind = "500"
    context_limit_chars: int | None = None
    """Prompts longer than this (total characters of message contents) get a 400
    ``context_length_exceeded`` error."""
    seed: int | None = 0
    model_name: str = "stub-model"
    """The one model ``GET /v1/models`` lists."""
    models_status: int = 200
    """The status ``GET /v1/models`` answers: 200 lists ``model_name``; e.g. 404 plays
    a server without the route, 401 one where listing needs other rights."""
    reject_unknown_model: bool = False
    """Chat requests naming another model than ``model_name`` get OpenAI's 404
    ``model_not_found`` (by default any name is answered)."""
    api_key: str | None = None
    """When set, requests without ``Authorization: Bearer <api_key>`` get a 401."""
    echo_key_in_401: bool = False
    """A 401's message quotes the request's ``Authorization`` header, as some providers
    and proxies do (``Incorrect API key provided: Bearer sk-…``): a test that the
    client never records the key it sent."""
    record_requests: bool = False
    """Keep every chat request body in ``StubServer.requests`` (in-process only)."""
    rate_limit_per_s: float | None = None
    """When set, a chat request arriving when ``floor(rate_limit_per_s) +
    rate_limit_burst`` requests were already admitted in the last second (a
    sliding 1 s window) gets a 429 with ``Retry-After`` (the time until a slot
    frees up); rejected requests do not count towards the window. The arrival
    times of admitted requests are kept in ``StubServer.admitted_times``."""
    rate_limit_burst: int = 0
    """Requests allowed in the window beyond ``floor(rate_limit_per_s)``."""
    max_in_flight: int | None = None
    """When set, a chat request arriving while this many chat requests are being
    answered gets a 429 (``Retry-After``: ``retry_after_s``), as a provider with a
    cap on concurrent requests answers; counted in ``stats["in_flight_limited"]``
    (and ``"429"``), the most held at once in ``stats["max_active"]``."""

    def __post_init__(self) -> None:
        total = self.rate_429 + self.rate_500 + self.rate_timeout + self.rate_malformed
        if not 0.0 <= total <= 1.0:
            raise InvalidArgumentError(f"fault rates must sum to between 0 and 1, got {total}")
        if self.fail_first_kind not in FAULT_KINDS:
            raise InvalidArgumentError(f"fail_first_kind must be one of {FAULT_KINDS}")
        if isinstance(self.reply_mode, str) and self.reply_mode not in (
            "echo_answer",
            "arithmetic",
        ):
            raise InvalidArgumentError(
                "reply_mode must be 'echo_answer', 'arithmetic' or a callable"
            )
        if self.rate_limit_per_s is not None and self.rate_limit_per_s < 1:
            raise InvalidArgumentError(
                "rate_limit_per_s must be at least 1 (requests per second) or None"
            )
        if self.rate_limit_burst < 0:
            raise InvalidArgumentError("rate_limit_burst must be 0 or more")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise InvalidArgumentError("max_in_flight must be at least 1 or None")

    @property
    def rate_limit_capacity(self) -> int | None:
        """Requests admitted per sliding 1 s window, or ``None`` without a rate limit."""
        if self.rate_limit_per_s is None:
            return None
        return int(self.rate_limit_per_s) + self.rate_limit_burst


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return str(content)


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


def _format_number(value: float) -> str:
    if value == int(value):
        return str(int(value))
    return f"{value:.6g}"


def arithmetic_reply(text: str) -> str:
    """The stub's "arithmetic" reply for ``text``: finds ``a op b`` and solves it."""
    match = _ARITH_RE.search(text)
    if match is None:
        return "<think>no arithmetic found</think>\n<answer>unknown</answer>"
    a_s, op, b_s = match.groups()
    a, b = float(a_s), float(b_s)
    if op == "+":
        result = a + b
    elif op == "-":
        result = a - b
    elif op in ("*", "x", "×"):
        result = a * b
    else:
        if b == 0:
            return f"<think>{a_s} {op} {b_s} divides by zero</think>\n<answer>undefined</answer>"
        result = a / b
    answer = _format_number(result)
    return f"<think>{a_s} {op} {b_s} = {answer}</think>\n<answer>{answer}</answer>"


def echo_answer_reply(text: str) -> str:
    """The stub's "echo_answer" reply: ``<answer>x</answer>`` for ``ANSWER_HINT: x``."""
    match = _HINT_RE.search(text)
    if match is None:
        return "ok"
    return f"<answer>{match.group(1).strip()}</answer>"


def _error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    error = {"message": message, "type": type_, "param": param, "code": code}
    return orjson.dumps({"error": error})


def _retry_after(seconds: float | None) -> str | None:
    return None if seconds is None else _format_number(seconds)


def _error(
    status: int,
    message: str,
    type_: str,
    code: str | None,
    param: str | None = None,
    *,
    retry_after: str | None = None,
) -> web.Response:
    """An OpenAI-shaped error response (with a ``Retry-After`` header when given)."""
    headers = dict(_JSON_HEADERS)
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    return web.Response(
        status=status, body=_error_body(message, type_, code, param), headers=headers
    )


class _StubApp:
    """The request handlers and counters; lives on the server's event loop."""

    def __init__(self, config: StubConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.stats: dict[str, int] = {
            "requests": 0,
            "ok": 0,
            "429": 0,
            "500": 0,
            "503": 0,
            "timeout": 0,
            "malformed": 0,
            "400": 0,
            "context": 0,
            "401": 0,
            "404": 0,
            "rate_limited": 0,
            "in_flight": 0,
            "max_in_flight": 0,
            "active": 0,
            "max_active": 0,
            "in_flight_limited": 0,
        }
        self.requests: list[dict[str, Any]] = []
        self.admitted_times: list[float] = []
        """``time.monotonic()`` of each request admitted by the rate limit."""
        self._window: deque[float] = deque()
        self._created = int(time.time())

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat_entry)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/stats", self.get_stats)
        return app

    async def models(self, request: web.Request) -> web.Response:
        if self._unauthorized(request):
            return self._unauthorized_response(request)
        if self.config.models_status != 200:
            return web.Response(
                status=self.config.models_status,
                body=_error_body(
                    "Listing models is not available (stub)", "invalid_request_error", None
                ),
                headers=_JSON_HEADERS,
            )
        body = {
            "object": "list",
            "data": [
                {
                    "id": self.config.model_name,
                    "object": "model",
                    "created": self._created,
                    "owned_by": "vfops-stub",
                }
            ],
        }
        return web.Response(body=orjson.dumps(body), headers=_JSON_HEADERS)

    def _unauthorized(self, request: web.Request) -> bool:
        key = self.config.api_key
        return key is not None and request.headers.get("Authorization") != f"Bearer {key}"

    def _unauthorized_response(self, request: web.Request) -> web.Response:
        message = "Incorrect API key provided"
        if self.config.echo_key_in_401:
            message += f": {request.headers.get('Authorization', '')}"
        return web.Response(
            status=401,
            body=_error_body(message, "invalid_request_error", "invalid_api_key"),
            headers=_JSON_HEADERS,
        )

    async def get_stats(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self.stats), headers=_JSON_HEADERS)

    def _rate_limited(self) -> float | None:
        """``None`` when the request is admitted, else seconds until a slot frees up."""
        capacity = self.config.rate_limit_capacity
        if capacity is None:
            return None
        now = time.monotonic()
        window = self._window
        while window and window[0] <= now - 1.0:
            window.popleft()
        if len(window) >= capacity:
            return max(0.001, window[0] + 1.0 - now)
        window.append(now)
        self.admitted_times.append(now)
        return None

    def _pick_fault(self, index: int) -> str | None:
        config = self.config
        if index < config.fail_first_n:
            return config.fail_first_kind
        r = self.rng.random()  # always drawn, so a seed gives a fixed fault sequence
        for kind, rate in (
            ("429", config.rate_429),
            ("500", config.rate_500),
            ("timeout", config.rate_timeout),
            ("malformed", config.rate_malformed),
        ):
            if r < rate:
                return kind
            r -= rate
        return None

    async def chat_entry(self, request: web.Request) -> web.Response:
        """Counts chat requests being answered (``active``); over ``max_in_flight``, 429."""
        stats = self.stats
        cap = self.config.max_in_flight
        if cap is not None and stats["active"] >= cap:
            await request.read()
            stats["requests"] += 1
            stats["429"] += 1
            stats["in_flight_limited"] += 1
            message = f"Too many concurrent requests: at most {cap} in flight (stub)"
            retry_after = _retry_after(self.config.retry_after_s)
            return _error(429, message, "requests", "rate_limit_exceeded", retry_after=retry_after)
        stats["active"] += 1
        stats["max_active"] = max(stats["max_active"], stats["active"])
        try:
            return await self.chat_completions(request)
        finally:
            stats["active"] -= 1

    async def chat_completions(self, request: web.Request) -> web.Response:
        """One chat request, through the stub's gates in the order a real server applies
        them: auth, the body, the model, the rate limit, an injected fault, latency, the
        context limit; then the reply."""
        index = self.stats["requests"]
        self.stats["requests"] = index + 1
        admitted = await self._admit(request)
        if isinstance(admitted, web.Response):
            return admitted
        payload, messages = admitted
        fault = self._pick_fault(index)
        if fault == "429":
            self.stats["429"] += 1
            return _error(429, "Rate limit reached (stub)", "requests", "rate_limit_exceeded",
                          retry_after=_retry_after(self.config.retry_after_s))  # fmt: skip
        if fault == "timeout":
            self.stats["timeout"] += 1
            await asyncio.sleep(self.config.timeout_sleep_s)
            fault = "500"
        await self._latency()
        texts = [_text_of(m.get("content")) for m in messages if isinstance(m, dict)]
        # (a Response is a MutableMapping: an empty one is falsy, so no `or` here)
        failed = self._fault_response(fault)
        if failed is None:
            failed = self._context_exceeded(texts, fault)
        if failed is not None:
            return failed
        return self._completion(payload, messages, texts, index)

    async def _admit(
        self, request: web.Request
    ) -> web.Response | tuple[dict[str, Any], list[dict[str, Any]]]:
        """The request's payload and messages, or the response refusing it (401, 400,
        404, or 429 over the rate limit)."""
        config, stats = self.config, self.stats
        if self._unauthorized(request):
            stats["401"] += 1
            return self._unauthorized_response(request)
        try:
            payload = orjson.loads(await request.read())
            messages = payload["messages"]
            if not isinstance(messages, list):
                raise TypeError("messages must be a list")
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            stats["400"] += 1
            return _error(400, f"invalid request body: {exc}", "invalid_request_error", None)
        if config.record_requests:
            self.requests.append(payload)
        if config.reject_unknown_model and payload.get("model") != config.model_name:
            stats["404"] += 1
            message = (
                f"The model `{payload.get('model')}` does not exist or you do not have "
                "access to it."
            )
            return _error(404, message, "invalid_request_error", "model_not_found")
        wait = self._rate_limited()
        if wait is not None:
            stats["429"] += 1
            stats["rate_limited"] += 1
            message = f"Rate limit reached: {config.rate_limit_capacity} requests per second (stub)"
            return _error(
                429, message, "requests", "rate_limit_exceeded", retry_after=f"{wait:.3f}"
            )
        return payload, messages

    async def _latency(self) -> None:
        if self.config.latency_ms <= 0:
            return
        stats = self.stats
        # counted while waiting: how many requests the stub holds at once
        stats["in_flight"] += 1
        stats["max_in_flight"] = max(stats["max_in_flight"], stats["in_flight"])
        try:
            await asyncio.sleep(self.config.latency_ms / 1000.0)
        finally:
            stats["in_flight"] -= 1

    def _fault_response(self, fault: str | None) -> web.Response | None:
        """The response of an injected server error, malformed body or bad request."""
        if fault in ("500", "503"):
            self.stats[fault] += 1
            return _error(int(fault), "The server had an error (stub)", "server_error", None)
        if fault == "malformed":
            self.stats["malformed"] += 1
            return web.Response(
                status=200, body=b'{"id": "chatcmpl-stub", "choices": [', headers=_JSON_HEADERS
            )
        if fault == "400":
            self.stats["400"] += 1
            return _error(400, "Invalid value for 'temperature' (stub)",
                          "invalid_request_error", "invalid_value", "temperature")  # fmt: skip
        return None

    def _context_exceeded(self, texts: list[str], fault: str | None) -> web.Response | None:
        limit = self.config.context_limit_chars
        if fault != "context" and (limit is None or sum(len(t) for t in texts) <= limit):
            return None
        self.stats["context"] += 1
        prompt_tokens = sum(len(t.split()) for t in texts)
        message = (
            f"This model's maximum context length is {limit} "
            f"characters. However, your messages resulted in {prompt_tokens} tokens. "
            "Please reduce the length of the messages."
        )
        return _error(400, message, "invalid_request_error", "context_length_exceeded",
                      "messages")  # fmt: skip

    def _completion(
        self, payload: dict[str, Any], messages: list[dict[str, Any]], texts: list[str], index: int
    ) -> web.Response:
        try:
            message = self._reply(payload, messages)
        except Exception as exc:  # a user callable failed: report it as a server error
            self.stats["500"] += 1
            return _error(500, f"reply callable failed: {exc!r}", "server_error", None)
        n = int(payload.get("n") or 1)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        completion_tokens = len(_text_of(message.get("content")).split())
        prompt_tokens = sum(len(t.split()) for t in texts)
        body = {
            "id": f"chatcmpl-stub-{index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": payload.get("model") or self.config.model_name,
            "choices": [
                {"index": i, "message": message, "logprobs": None, "finish_reason": finish}
                for i in range(n)
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens * n,
                "total_tokens": prompt_tokens + completion_tokens * n,
            },
        }
        self.stats["ok"] += 1
        if payload.get("stream"):
            usage = bool((payload.get("stream_options") or {}).get("include_usage"))
            events = sse_events(body, include_usage=usage)
            return web.Response(body=events, content_type="text/event-stream")
        return web.Response(body=orjson.dumps(body), headers=_JSON_HEADERS)

    def _reply(self, payload: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
        mode = self.config.reply_mode
        if callable(mode):
            message = dict(mode(payload))
            message.setdefault("role", "assistant")
            message.setdefault("content", None)
            return message
        text = _last_user_text(messages)
        content = arithmetic_reply(text) if mode == "arithmetic" else echo_answer_reply(text)
        return {"role": "assistant", "content": content}


async def _start(config: StubConfig, host: str, port: int) -> tuple[web.AppRunner, _StubApp, int]:
    stub = _StubApp(config)
    runner = web.AppRunner(
        stub.make_app(),
        access_log=None,
        handle_signals=False,
        handler_cancellation=True,  # a client that hangs up cancels its hanging handler
        shutdown_timeout=0.5,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    server = site._server
    assert isinstance(server, asyncio.base_events.Server)
    bound_port = int(server.sockets[0].getsockname()[1])
    return runner, stub, bound_port


async def _shutdown(runner: web.AppRunner) -> None:
    # Let connections already accepted by the kernel finish asyncio's accept first:
    # closing the listening server under a pending accept leaks that socket
    # (asyncio.Server._attach asserts, and Python 3.11 never closes it).
    await asyncio.sleep(0.01)
    await runner.cleanup()


def run_stub_server(
    config: StubConfig | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    on_ready: Callable[[int], None] | None = None,
) -> None:
    """Serve until interrupted (blocking). ``port=0`` picks a free port;
    ``on_ready(port)`` is called once it listens."""

    async def serve() -> None:
        runner, _stub, bound = await _start(config or StubConfig(), host, port)
        try:
            if on_ready is not None:
                on_ready(bound)
            await asyncio.Event().wait()
        finally:
            await _shutdown(runner)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


_IN_PROCESS_ONLY = frozenset({"record_requests", "rate_limit_per_s", "rate_limit_burst"})


def config_to_argv(config: StubConfig) -> list[str]:
    """Command-line flags for ``python -m vfops.testing.stub_server`` equivalent to ``config``."""
    if callable(config.reply_mode):
        raise InvalidArgumentError("a callable reply_mode works only in-process (subprocess=False)")
    if config.record_requests:
        raise InvalidArgumentError("record_requests works only in-process (subprocess=False)")
    if config.rate_limit_per_s is not None or config.rate_limit_burst:
        # the command line (vfops.testing.stub_server) has no --rate-limit-* flags yet
        raise InvalidArgumentError("rate_limit_per_s works only in-process (subprocess=False)")
    argv: list[str] = []
    defaults = StubConfig()
    for f in fields(StubConfig):
        value = getattr(config, f.name)
        if f.name in _IN_PROCESS_ONLY or value == getattr(defaults, f.name):
            continue
        flag = "--" + f.name.replace("_", "-")
        argv += [flag, "none" if value is None else str(value)]
    return argv


@dataclass
class StubServer:
    """A stub server on a free loopback port, in a background thread or a subprocess.

    ``with StubServer(StubConfig(latency_ms=50)) as server: server.base_url``.
    ``stats`` counts requests by outcome; ``requests`` holds request bodies when
    ``config.record_requests`` (in-process only).
    """

    config: StubConfig = field(default_factory=StubConfig)
    subprocess: bool = False
    host: str = "127.0.0.1"
    port: int = 0
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)
    _runner: web.AppRunner | None = field(default=None, init=False, repr=False)
    _stub: _StubApp | None = field(default=None, init=False, repr=False)
    _proc: _subprocess.Popen[str] | None = field(default=None, init=False, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def stats(self) -> dict[str, int]:
        if self._stub is not None:
            return dict(self._stub.stats)
        with urllib.request.urlopen(f"http://{self.host}:{self.port}/stats", timeout=10) as resp:
            data: dict[str, int] = orjson.loads(resp.read())
        return data

    @property
    def admitted_times(self) -> list[float]:
        """``time.monotonic()`` of each chat request admitted by the rate limit
        (``config.rate_limit_per_s``), in-process only."""
        if self._stub is None:
            raise RuntimeError("admitted_times works only for an in-process StubServer")
        return list(self._stub.admitted_times)

    @property
    def requests(self) -> list[dict[str, Any]]:
        if self._stub is None:
            raise RuntimeError("request recording works only for an in-process StubServer")
        return self._stub.requests

    def start(self) -> StubServer:
        if self.subprocess:
            self._start_subprocess()
        else:
            self._start_thread()
        return self

    def _start_thread(self) -> None:
        ready = threading.Event()
        errors: list[BaseException] = []
        loop = asyncio.new_event_loop()
        self._loop = loop

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                self._runner, self._stub, self.port = loop.run_until_complete(
                    _start(self.config, self.host, self.port)
                )
            except BaseException as exc:
                errors.append(exc)
                ready.set()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name="vfops-stub-server", daemon=True)
        self._thread.start()
        ready.wait()
        if errors:
            self._thread.join()
            loop.close()
            self._loop = None
            raise errors[0]

    def _start_subprocess(self) -> None:
        cmd = [
            sys.executable, "-m", "vfops.testing.stub_server",
            "--host", self.host, "--port", str(self.port),
            *config_to_argv(self.config),
        ]  # fmt: skip
        self._proc = _subprocess.Popen(cmd, stdout=_subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        match = re.search(r":(\d+)/v1", line)
        if match is None:
            self._proc.kill()
            self._proc.wait()
            self._proc.stdout.close()
            raise RuntimeError(f"stub server subprocess failed to start: {line!r}")
        self.port = int(match.group(1))

    def stop(self) -> None:
        if self._proc is not None:
            proc, self._proc = self._proc, None
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except _subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self._loop is not None and self._thread is not None:
            loop, thread = self._loop, self._thread
            if self._runner is not None:
                asyncio.run_coroutine_threadsafe(_shutdown(self._runner), loop).result(timeout=30)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=30)
            self._loop = self._thread = self._runner = None

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
