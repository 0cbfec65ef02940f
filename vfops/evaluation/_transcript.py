"""One rollout as readable text: every message, tool call and score (``vfops runs show``).

A score is understood by reading the conversation that earned it, so a transcript
shows all of it: the prompt, each turn with its role, the tool calls an assistant
made (name and arguments) and the results that came back, the expected answer,
each reward function's score, the error if any, and the token counts.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

from vfops._rollout import RolloutRecord

__all__ = ["format_transcript", "rollout_failed"]

_INDENT = "    "


def rollout_failed(record: RolloutRecord, pass_threshold: float = 1.0) -> bool:
    """An error, no reward, or a reward below ``pass_threshold``."""
    return record.error is not None or record.reward is None or record.reward < pass_threshold


def _text(content: Any) -> str:
    """A message's content as text: a string, or the text of its parts (images named)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict) and part.get("type") == "image_url":
                parts.append(_image(part.get("image_url")))
            elif isinstance(part, dict):
                parts.append(f"<{part.get('type', 'part')}>")
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return str(content)


def _image(found: Any) -> str:
    """An image part named by what it is: a data URL's type and size (its bytes would be
    a screenful of base64), else its URL."""
    url = str(found.get("url", "") if isinstance(found, dict) else found or "")
    if url.startswith("data:"):
        header, _, data = url.partition(",")
        kind = header[5:].split(";")[0] or "image"
        size = len(data) * 3 // 4 - data.endswith("=") - data.endswith("==")
        return f"<image {kind}, {size:,} bytes>"
    return f"<image {url}>"


def _block(text: str, width: int) -> list[str]:
    """``text`` indented, long lines wrapped, blank lines kept (they carry meaning)."""
    lines: list[str] = []
    for line in text.splitlines() or [""]:
        wrapped = textwrap.wrap(
            line, width=max(width - len(_INDENT), 20), replace_whitespace=False,
            drop_whitespace=False, break_long_words=True, break_on_hyphens=False,
        ) or [""]  # fmt: skip
        lines.extend(_INDENT + piece for piece in wrapped)
    return lines


def _tool_call(call: dict[str, Any]) -> str:
    function = call.get("function") or {}
    name = function.get("name") or call.get("name") or "?"
    arguments = function.get("arguments", call.get("arguments", ""))
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    ident = f" [{call['id']}]" if call.get("id") else ""
    return f"-> tool call {name}({arguments}){ident}"


def _message(message: dict[str, Any], width: int) -> list[str]:
    role = str(message.get("role", "?"))
    label = f"[{role} {message['tool_call_id']}]" if message.get("tool_call_id") else f"[{role}]"
    if message.get("name") and role == "tool":
        label = label[:-1] + f" {message['name']}]"
    lines = [label]
    text = _text(message.get("content"))
    if text or not message.get("tool_calls"):
        lines += _block(text, width)
    for call in message.get("tool_calls") or []:
        lines += _block(_tool_call(call), width)
    return lines


def _number(value: float | None) -> str:
    return "none" if value is None else f"{value:.4f}"


def format_transcript(record: RolloutRecord, *, width: int = 100) -> str:
    """The whole rollout as plain text, ``width`` columns at most (long words wrap)."""
    usage = record.usage
    where = f"rollout {record.rollout_index}"
    if record.episode is not None:
        where = f"episode {record.episode}, agent {record.agent or '-'} ({where})"
    facts = [
        f"== example {record.example_id}, {where}: "
        f"reward {_number(record.reward)}, stop {record.stop_reason}",
        f"{record.turns} turn{'s' if record.turns != 1 else ''}, tokens "
        f"{usage.prompt_tokens} prompt / {usage.completion_tokens} completion",
    ]
    if record.metrics:
        facts.append(
            "scores: " + ", ".join(f"{name} {_number(v)}" for name, v in record.metrics.items())
        )
    facts.append(f"expected answer: {record.answer!r}" if record.answer else "expected answer: -")
    if record.error is not None:
        facts.append(f"error: {record.error.type}: {record.error.message}")
    lines: list[str] = []
    for fact in facts:
        lines += textwrap.wrap(fact, width=width, subsequent_indent=_INDENT) or [""]
    lines.append("-- prompt")
    for message in record.prompt:
        lines += _message(message, width)
    lines.append("-- completion")
    for message in record.completion:
        lines += _message(message, width)
    if not record.completion:
        lines.append(_INDENT + "(no completion)")
    return "\n".join(lines)
