"""The base parser: turns a completion into the text a reward function grades."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vfops._types import Message, Messages


def message_text(message: Message) -> str:
    """The text of a chat message whose content is a str, None or a list of parts."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") == "text":
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
        return "".join(parts)
    return str(content)


def last_user_text(prompt: Messages | str) -> str:
    """The text of the last user message of a prompt (the prompt itself if a str)."""
    if isinstance(prompt, str):
        return prompt
    for message in reversed(prompt):
        if message.get("role") == "user":
            return message_text(message)
    return ""


class Parser:
    """Identity parser: the answer is the last assistant message's text."""

    def parse(self, text: str) -> Any:
        return text

    def get_assistant_messages(self, completion: Messages | str) -> Messages:
        """Assistant messages of a completion; a bare str counts as one message."""
        if isinstance(completion, str):
            return [{"role": "assistant", "content": completion}]
        return [m for m in completion if m.get("role") == "assistant"]

    def parse_answer(self, completion: Messages | str) -> str | None:
        """The parsed last assistant message, or None when there is none."""
        messages = self.get_assistant_messages(completion)
        if not messages:
            return None
        parsed = self.parse(message_text(messages[-1]))
        if parsed is None:
            return None
        return parsed if isinstance(parsed, str) else str(parsed)

    def is_well_formed(self, text: str) -> bool:
        """Whether one assistant message follows the parser's format."""
        return True

    def get_format_reward_func(self) -> Callable[..., float]:
        """A reward function: the fraction of assistant messages that are well-formed.

        Assistant messages that only carry tool calls (no text) are not counted:
        they have no text to be malformed.
        """
        is_well_formed = self.is_well_formed

        def format_reward(completion: Messages | str) -> float:
            messages = self.get_assistant_messages(completion)
            texts = [
                message_text(m)
                for m in messages
                if not (m.get("tool_calls") and not message_text(m).strip())
            ]
            if not texts:
                return 0.0
            return sum(1.0 for t in texts if is_well_formed(t)) / len(texts)

        return format_reward
