"""How a v1 rollout's model calls reach a vfops client: ``verifiers``' own interception
server, with two additions.

- **Its client is vfops's.** The interception server owns one ``verifiers`` ``Client``
  per endpoint configuration; here that client is :class:`VfopsModelClient`, which sends
  the chat-completions body ``verifiers`` built (the rollout's model and sampling imposed
  by its dialect) through a vfops :class:`~vfops.clients.ModelClient`: the pooled OpenAI
  client with its retries, ``Retry-After``, adaptive concurrency, shared budgets and cost
  caps, the in-process local model, or a training backend whose responses carry token ids
  and log-probs. Which vfops client serves a rollout is named by the endpoint
  configuration's ``base_url`` (``http://vfops-client-<n>.invalid/v1``, never dialled).
- **Calls can be made in-process.** :meth:`InProcessInterception.chat` runs the very
  handler the server's ``/v1/chat/completions`` route runs (the rollout's ``@stop`` and
  limits, request and response interceptors, the message graph, the per-call record),
  without the loopback HTTP hop: vfops's harness (:mod:`vfops.adapters._v1_harness`) is
  a chat loop in this process, so a rollout costs its model calls and no process. The
  server still listens on loopback for what needs it: a toolset's MCP servers reach the
  rollout's ``/state`` and ``/task`` there.

What each rollout's model calls returned (the vfops responses: usage, cost, token ids)
and a cap that stopped the run are collected in the rollout's :class:`RolloutLedger`,
a context variable set around the rollout, since ``verifiers`` keeps only its own parse
of each response.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import orjson
from multidict import CIMultiDict, CIMultiDictProxy
from verifiers.v1.clients import Client
from verifiers.v1.configs.client import BaseClientConfig, EvalClientConfig
from verifiers.v1.dialects import ChatDialect, Dialect
from verifiers.v1.errors import model_error
from verifiers.v1.graph import PendingTurn
from verifiers.v1.interception import InterceptionServer
from verifiers.v1.types import Response, SamplingConfig

from vfops.adapters._wire import completion_json
from vfops.clients import ChatResponse, ModelClient, PromptTooLongError
from vfops.costs import BudgetExhausted

CHAT = ChatDialect()
"""The wire format vfops's harness speaks (OpenAI chat completions)."""

_CLIENT_HOST = "vfops-client-{}.invalid"


@dataclass
class ToolTally:
    """One trace's tool calls as its harness ran them: how many, how many failed (the
    tool raised or answered with an error result), and the first failure's text."""

    calls: int = 0
    errors: int = 0
    first_error: str | None = None

    def add(self, error: str | None) -> None:
        self.calls += 1
        if error is not None:
            self.errors += 1
            if self.first_error is None:
                self.first_error = error[:500]


@dataclass
class RolloutLedger:
    """What one episode's model calls returned, as vfops sees them, by trace id (the
    interception's session id: an episode of several agents has several traces)."""

    responses: dict[str, list[ChatResponse]] = field(default_factory=dict)
    tools: dict[str, ToolTally] = field(default_factory=dict)
    stopped_by: BaseException | None = None
    """A cap that stopped the run (:class:`~vfops.costs.BudgetExhausted`): re-raised once the
    rollout is closed, so the run ends as vfops's own environments end it."""


_LEDGER: ContextVar[RolloutLedger | None] = ContextVar("vfops_v1_ledger", default=None)


def current_ledger() -> RolloutLedger | None:
    """The ledger of the episode running in this context, if any."""
    return _LEDGER.get()


@contextmanager
def ledger() -> Iterator[RolloutLedger]:
    """A fresh ledger for the rollout run inside the block (in this task's context)."""
    current = RolloutLedger()
    token = _LEDGER.set(current)
    try:
        yield current
    finally:
        _LEDGER.reset(token)


class ClientDirectory:
    """The vfops clients rollouts may use, each under an endpoint configuration of its
    own: ``verifiers`` keys its clients by configuration, vfops by object."""

    def __init__(self) -> None:
        self._by_host: dict[str, ModelClient] = {}
        self._by_client: dict[int, EvalClientConfig] = {}
        self._numbers = itertools.count()

    def config_for(self, client: ModelClient) -> EvalClientConfig:
        found = self._by_client.get(id(client))
        if found is None or self._by_host.get(_host(found)) is not client:
            host = _CLIENT_HOST.format(next(self._numbers))
            found = EvalClientConfig(base_url=f"http://{host}/v1")
            self._by_client[id(client)] = found
            self._by_host[host] = client
        return found

    def client_for(self, config: BaseClientConfig) -> ModelClient:
        client = self._by_host.get(_host(config))
        if client is None:
            raise model_error(
                f"no vfops client serves {config.base_url}; models are called through vfops",
                status_code=400,
            )
        return client


def _host(config: BaseClientConfig) -> str:
    return str(config.base_url).split("//", 1)[-1].split("/", 1)[0]


class VfopsModelClient(Client):  # type: ignore[misc]
    """A ``verifiers`` client whose transport is a vfops :class:`ModelClient`."""

    def __init__(self, model_client: ModelClient) -> None:
        self.model_client = model_client

    async def get_response(
        self,
        dialect: Dialect,
        body: dict[str, Any],
        sampling: SamplingConfig,
        session_id: str | None = None,
        turn: PendingTurn | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        if not isinstance(dialect, ChatDialect):
            raise model_error(
                f"vfops calls models over chat completions, not {type(dialect).__name__}",
                status_code=400,
            )
        args = dict(body)
        model = str(args.pop("model"))
        messages = args.pop("messages")
        tools = args.pop("tools", None)
        for transport_only in ("stream", "stream_options"):
            args.pop(transport_only, None)
        if args.get("n") == 1:
            del args["n"]
        try:
            response = await self.model_client.chat(
                model=model, messages=messages, sampling_args=args, tools=tools or None
            )
        except BudgetExhausted as exc:
            found = _LEDGER.get()
            if found is not None:
                found.stopped_by = exc
            raise model_error(str(exc), status_code=402) from exc
        except PromptTooLongError as exc:
            # the provider's context-overflow answer, which a chat harness ends its run on
            raise model_error(f"context length exceeded: {exc}", status_code=400) from exc
        except Exception as exc:  # vfops's client retried already: the call failed
            raise model_error(
                f"{type(exc).__name__}: {exc}", status_code=getattr(exc, "status_code", 502)
            ) from exc
        found = _LEDGER.get()
        if found is not None:
            found.responses.setdefault(session_id or "", []).append(response)
        raw = completion_json(response, model)
        parsed = dialect.parse_response(dialect.validate_response(raw))
        parsed.raw = raw
        return parsed

    async def close(self) -> None:
        """The vfops client belongs to whoever made it (it outlives the run)."""


class _InProcessRequest(dict[str, Any]):
    """The part of an aiohttp request the interception's route handler reads."""

    def __init__(self, path: str, secret: str, body: bytes) -> None:
        super().__init__()
        self.path = path
        self.headers = CIMultiDictProxy(
            CIMultiDict({"Authorization": f"Bearer {secret}", "Content-Type": "application/json"})
        )
        self.content_length = len(body)
        self._read_bytes: bytes | None = body

    async def read(self) -> bytes:
        return self._read_bytes or b""


class InProcessInterception(InterceptionServer):  # type: ignore[misc]
    """``verifiers``' interception server, serving vfops clients and in-process calls."""

    def __init__(
        self, clients: ClientDirectory, state_service_secrets: tuple[str, ...] = ()
    ) -> None:
        # the keys of the taskset's shared tool servers: with them a shared server reads
        # and writes each rollout's state over /state (Env.serving() hands them over too)
        super().__init__(state_service_secrets=state_service_secrets)
        self._directory = clients
        self._chat_handler = self._handler_for(CHAT)

    def _client(self, config: BaseClientConfig) -> Client:
        return VfopsModelClient(self._directory.client_for(config))

    async def chat(self, secret: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """One chat-completions call of the rollout holding ``secret``, through the route
        handler: ``(HTTP status, JSON body)``, as the program would have received them."""
        request = _InProcessRequest(CHAT.routes[0], secret, orjson.dumps(body))
        # A task of its own, as aiohttp gives each request: the handler adopts the task it
        # runs in, and the rollout cancels its adopted tasks when it concludes
        response = await asyncio.ensure_future(self._chat_handler(request))
        return int(response.status), orjson.loads(response.body)

    async def decide_tool(
        self, secret: str, call_id: str, name: str, arguments: object
    ) -> dict[str, Any]:
        """The rollout's tool gate (the ``/tool`` route's verdict), in-process."""
        session = self.sessions.get(secret)
        if session is None or session.released:
            return {"action": "stop", "reason": "rollout concluded"}
        verdict: dict[str, Any] = await asyncio.ensure_future(
            session.decide_tool(call_id, name, arguments)
        )
        return verdict


_SERVERS: dict[str, InProcessInterception] = {}
"""Live in-process interceptions by base URL: where the harness finds the one behind
the endpoint it was handed."""


def register(server: InProcessInterception) -> None:
    _SERVERS[server.base_url.rstrip("/")] = server


def unregister(server: InProcessInterception) -> None:
    _SERVERS.pop(server.base_url.rstrip("/"), None)


def interception_at(endpoint: str) -> InProcessInterception | None:
    """The in-process interception serving ``endpoint`` (``<base>/v1``), if any."""
    base = endpoint.rstrip("/").removesuffix("/v1")
    return _SERVERS.get(base)
