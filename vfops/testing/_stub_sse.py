"""The stub's streamed answer (``"stream": true``): a whole completion as the
server-sent events an OpenAI-compatible server sends, as a client that streams (the
``openai`` SDK's chat-completion stream, verifiers' chat program) reads them."""

from __future__ import annotations

from typing import Any

import orjson


def sse_events(completion: dict[str, Any], *, include_usage: bool) -> bytes:
    """``completion`` (a ``chat.completion`` body) as ``chat.completion.chunk`` events:
    per choice, one delta with the role, content and tool calls, then one with the
    finish reason; the usage in a last chunk when asked (``stream_options``); ``[DONE]``."""
    head = {k: completion[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    events: list[dict[str, Any]] = []
    for choice in completion["choices"]:
        message = choice["message"]
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            delta["tool_calls"] = [
                {"index": i, **call} for i, call in enumerate(message["tool_calls"])
            ]
        index = choice["index"]
        events.append({**head, "choices": [{"index": index, "delta": delta}]})
        finish = {"index": index, "delta": {}, "finish_reason": choice["finish_reason"]}
        events.append({**head, "choices": [finish]})
    if include_usage:
        events.append({**head, "choices": [], "usage": completion["usage"]})
    lines = [b"data: " + orjson.dumps(event) + b"\n\n" for event in events]
    return b"".join(lines) + b"data: [DONE]\n\n"
