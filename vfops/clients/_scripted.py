"""A scripted in-process client for unit tests of environment logic (no network)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from vfops._types import Message, Messages, SamplingArgs
from vfops.clients._base import ChatResponse

Reply = str | Message | ChatResponse | BaseException
Responder = Callable[[Messages, list[dict[str, Any]] | None], Reply | Awaitable[Reply]]


class ScriptedClient:
    """Answers each ``chat`` call from a script.

    ``replies`` is either a list consumed in order (cycled when ``cycle=True``) or a
    function ``(messages, tools) -> reply``. A reply is a string (assistant text),
    a message dict, a :class:`ChatResponse`, or an exception to raise. Every call
    is recorded in ``calls`` so tests can assert what the environment sent.
    """

    def __init__(
        self,
        replies: list[Reply] | Responder,
        *,
        cycle: bool = False,
        delay_s: float = 0.0,
    ) -> None:
        self._replies = replies
        self._cycle = cycle
        self._delay_s = delay_s
        self._index = 0
        self.calls: list[dict[str, Any]] = []

    async def chat(
        self,
        *,
        model: str,
        messages: Messages,
        sampling_args: SamplingArgs | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatResponse:
        self.calls.append(
            {
                "model": model,
                "messages": [dict(m) for m in messages],
                "sampling_args": dict(sampling_args or {}),
                "tools": tools,
            }
        )
        if self._delay_s:
            await asyncio.sleep(self._delay_s)
        reply = await self._next_reply(messages, tools)
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, ChatResponse):
            return reply
        if isinstance(reply, str):
            reply = {"role": "assistant", "content": reply}
        finish = "tool_calls" if reply.get("tool_calls") else "stop"
        completion_tokens = len(str(reply.get("content") or "").split())
        prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in messages)
        return ChatResponse(
            message=reply,
            finish_reason=finish,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )

    async def _next_reply(self, messages: Messages, tools: list[dict[str, Any]] | None) -> Reply:
        if callable(self._replies):
            result = self._replies(messages, tools)
            if asyncio.iscoroutine(result) or isinstance(result, Awaitable):
                return await result
            return result
        if self._index >= len(self._replies):
            if not self._cycle:
                raise RuntimeError("ScriptedClient ran out of scripted replies")
            self._index = 0
        reply = self._replies[self._index]
        self._index += 1
        return reply

    async def aclose(self) -> None:
        return None
