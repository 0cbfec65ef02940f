"""The OpenAI chat-completion body both ``verifiers`` adapters hand their library's
response parser: a vfops :class:`~vfops.clients.ChatResponse` in the provider's shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vfops.clients import TOKENS_KEY, ChatResponse


def completion_json(response: ChatResponse, model: str) -> dict[str, Any]:
    """An OpenAI ``ChatCompletion`` body for ``verifiers``' response parser. Token ids
    and log-probs, when the backend reports them, travel as vLLM names them
    (``prompt_token_ids``, ``choices[0].token_ids``, ``logprobs.content``)."""
    raw = response.raw if isinstance(response.raw, Mapping) else {}
    message: dict[str, Any] = {"role": "assistant", "content": response.message.get("content")}
    if response.message.get("tool_calls"):
        message["tool_calls"] = response.message["tool_calls"]
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": response.finish_reason or "stop",
    }
    body: dict[str, Any] = {
        "id": str(raw.get("id") or "vfops"),
        "object": "chat.completion",
        "created": int(raw.get("created") or 0),
        "model": str(raw.get("model") or model),
        "choices": [choice],
        "usage": {
            "prompt_tokens": response.prompt_tokens,
            "completion_tokens": response.completion_tokens,
            "total_tokens": response.prompt_tokens + response.completion_tokens,
        },
    }
    tokens = raw.get(TOKENS_KEY)
    if isinstance(tokens, Mapping) and tokens.get("completion_ids") is not None:
        body["prompt_token_ids"] = list(tokens.get("prompt_ids") or [])
        choice["token_ids"] = list(tokens["completion_ids"])
        choice["logprobs"] = {
            "content": [
                {"token": str(t), "logprob": float(lp), "bytes": None, "top_logprobs": []}
                for t, lp in zip(
                    tokens["completion_ids"], tokens.get("completion_logprobs") or [], strict=False
                )
            ]
        }
    return body
