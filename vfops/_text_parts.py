"""Chat messages for a text-only model's chat template.

OpenAI's API lets a message's ``content`` be a list of parts; a list of only text parts
means their concatenation. Llama-family chat templates (SmolLM2's, the tiny model's)
concatenate ``content`` as a string, so a list reaches them as a ``TypeError`` deep in
Jinja. Text parts are joined here; any other part (an image, audio) is refused in one
line naming the message and the part, since a text-only model cannot take it and
dropping it would score a prompt the model never saw.
"""

from __future__ import annotations

from typing import Any

from vfops._errors import InvalidArgumentError
from vfops._types import Messages

__all__ = ["text_only"]


def text_only(messages: Messages) -> list[dict[str, Any]]:
    """``messages`` as plain dicts whose list contents are joined text parts."""
    out = []
    for index, message in enumerate(messages):
        item = dict(message)
        content = item.get("content")
        if isinstance(content, list):
            item["content"] = "".join(_text(part, index) for part in content)
        out.append(item)
    return out


def _text(part: Any, index: int) -> str:
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    if kind == "text" and isinstance(part.get("text"), str):
        return str(part["text"])
    raise InvalidArgumentError(
        f"message {index} has a content part of type {kind!r}; this model takes text only "
        "(serve a model that accepts it, e.g. a vision model on vLLM, or send text)"
    )
