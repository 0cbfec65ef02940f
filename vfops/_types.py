"""Plain type aliases shared by every layer (OpenAI chat format throughout)."""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]
"""One OpenAI chat message: ``{"role": ..., "content": ..., "tool_calls"?: [...]}``."""
Messages = list[Message]
State = dict[str, Any]
"""Mutable per-rollout state: environments and reward functions read and write it."""
Info = dict[str, Any]
SamplingArgs = dict[str, Any]
"""Keyword arguments for ``chat.completions.create`` (temperature, max_tokens, ...)."""
