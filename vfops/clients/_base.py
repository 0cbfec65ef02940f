"""The model-client interface every environment talks to.

One async method, OpenAI chat semantics. Implementations: :class:`OpenAIClient`
(any OpenAI-compatible HTTP endpoint), :class:`ScriptedClient` (unit tests) and
the in-process local CPU model (``vfops.local``, needs the ``[train]`` extra).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from vfops._types import Message, Messages, SamplingArgs

TOKENS_KEY = "vfops_tokens"
"""Key under which a generation backend puts a turn's token ids and log-probabilities in
``ChatResponse.raw`` (:class:`vfops.training.TurnTokens`); here, with the response, so that
adapters below training can pass them on."""


@dataclass(slots=True)
class ChatResponse:
    """One assistant turn.

    ``message`` is a plain OpenAI assistant message dict (``role``, ``content``
    and, for native tool calls, ``tool_calls`` with ``id``/``type``/``function``).
    ``finish_reason`` is the server's (``stop``, ``length``, ``tool_calls``...).
    """

    message: Message
    finish_reason: str | None = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens served from the endpoint's cache (``prompt_tokens_details``)."""
    cost_usd: float | None = None
    """What the call cost, from the endpoint's prices (``None``: unpriced)."""
    raw: dict[str, Any] | None = field(default=None, repr=False)


class PromptTooLongError(Exception):
    """The server rejected the request because the context is too long."""


@runtime_checkable
class ModelClient(Protocol):
    """Anything that can produce the next assistant message."""

    async def chat(
        self,
        *,
        model: str,
        messages: Messages,
        sampling_args: SamplingArgs | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatResponse: ...

    async def aclose(self) -> None: ...
