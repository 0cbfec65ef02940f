"""Request middleware: what wraps a client's requests without being the HTTP.

A client sends; everything else that concerns a request (reserving its worst-case
cost on a spending cap, sharing the endpoint's pushbacks with other processes) is a
:class:`RequestMiddleware` installed on it, so the client stays one job (the wire
protocol) and a new concern is one more middleware, not one more argument threaded
through the evaluation.

A middleware *wraps* the client's send function once, when it is installed (not
per request): one that only needs the client's lifetime (the peer sync, a
background task) returns ``send`` unchanged and costs the requests nothing, and a
client without middleware sends as before (no request object is even built). A
middleware that is also an async context manager is entered when installed with
:func:`installed` and exited when removed.

:class:`PricedRequests` is the cost ledger's: a client with ``pricing`` has it from
the start, so every priced client (the policy's, a judge's) reserves against the
evaluation's ledger (:func:`vfops.costs.use_ledger`) without being handed it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from vfops.clients._errors import APIStatusError
from vfops.costs import (
    DEFAULT_MAX_COMPLETION_TOKENS,
    BudgetExhausted,
    Pricing,
    current_ledger,
    prompt_tokens_bound,
    requested_completion_tokens,
)

if TYPE_CHECKING:
    from vfops._types import Messages, SamplingArgs
    from vfops.clients._base import ChatResponse


@dataclass(slots=True, frozen=True)
class ChatRequest:
    """One chat request as the middleware sees it: what was asked, and its encoded body."""

    model: str
    messages: Messages
    sampling_args: SamplingArgs | None
    tools: list[dict[str, Any]] | None
    payload: bytes
    headers: dict[str, str] | None


Send = Callable[[ChatRequest], Awaitable["ChatResponse"]]
"""Sends a request (with retries) and returns its response."""


@runtime_checkable
class RequestMiddleware(Protocol):
    """Wraps a client's send function (see the module docstring)."""

    def wrap(self, send: Send) -> Send:
        """``send`` with this middleware around it (``send`` itself: no per-request work)."""
        ...


class MiddlewareClient(Protocol):
    """A client that takes middleware (:class:`vfops.clients.OpenAIClient`)."""

    def use(self, middleware: RequestMiddleware) -> None: ...

    def remove(self, middleware: RequestMiddleware) -> None: ...


@contextlib.asynccontextmanager
async def installed(client: Any, *middlewares: RequestMiddleware) -> AsyncIterator[None]:
    """``middlewares`` on ``client`` while inside, each entered first when it is an async
    context manager (a client that takes no middleware still gets their lifetimes)."""
    if not middlewares:
        yield
        return
    takes = callable(getattr(client, "use", None))
    async with contextlib.AsyncExitStack() as stack:
        for middleware in middlewares:
            if hasattr(middleware, "__aenter__"):
                await stack.enter_async_context(middleware)  # type: ignore[arg-type]
            if takes:
                client.use(middleware)
                stack.callback(client.remove, middleware)
        yield


class PricedRequests:
    """Prices each response (``ChatResponse.cost_usd``) and, inside an evaluation with a
    cost cap (:func:`vfops.costs.use_ledger`), reserves the request's worst-case cost on
    the ledger before sending it and settles what it cost after."""

    def __init__(self, pricing: Pricing) -> None:
        self.pricing = pricing

    def wrap(self, send: Send) -> Send:
        pricing = self.pricing

        async def priced(request: ChatRequest) -> ChatResponse:
            ledger = current_ledger()
            if ledger is None:
                response = await send(request)
                response.cost_usd = pricing.cost(
                    response.prompt_tokens, response.completion_tokens, response.cached_tokens
                )
                return response
            requested = requested_completion_tokens(request.sampling_args)
            completion_bound = DEFAULT_MAX_COMPLETION_TOKENS if requested is None else requested
            prompt_bound = prompt_tokens_bound(request.messages, request.tools)
            worst = pricing.worst_case(prompt_bound, completion_bound)
            try:
                reservation = await ledger.reserve(worst)
            except BudgetExhausted as exc:
                if requested is not None:
                    raise
                # the worst case is mostly an assumed completion length: say how to bound it
                raise exc.with_note(
                    f"it assumes {completion_bound:,} completion tokens without -t; set "
                    "-t/--max-tokens to reserve less, or raise --max-cost"
                ) from None
            try:
                response = await send(request)
            except APIStatusError:  # the endpoint refused it: not billed
                await asyncio.shield(ledger.settle(reservation, 0.0))
                raise
            except BaseException:  # lost or cancelled in flight: it may have been billed
                await asyncio.shield(ledger.settle(reservation, worst))
                raise
            response.cost_usd = pricing.cost(
                response.prompt_tokens, response.completion_tokens, response.cached_tokens
            )
            await asyncio.shield(ledger.settle(reservation, response.cost_usd))
            return response

        return priced
