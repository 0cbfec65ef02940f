"""What a model call costs: USD per million tokens, from the usage the endpoint reports.

Prices are per endpoint alias (``endpoints.toml``'s ``input_price_per_mtok``,
``output_price_per_mtok`` and optionally ``cached_input_price_per_mtok``). An
endpoint without prices is *unpriced*: its calls have no cost (``None``), which is
never shown as 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vfops._errors import InvalidArgumentError
from vfops._types import Messages

PER_MTOK = 1_000_000.0

CAP_TOLERANCE_USD = 1e-9
"""Float sums of many small amounts drift by ~1e-16 each: a request that fits a cap
exactly must not be refused for it (a nano-dollar is below any price). Both the
registry's compare-and-set and the ledger's final refusal use it."""

MESSAGE_OVERHEAD_TOKENS = 16
"""Tokens a chat template may add per message (role markers, separators): generous,
since the worst-case estimate must never be below what the endpoint bills."""
TOOLS_OVERHEAD_TOKENS = 64
"""Tokens a chat template may add around a request's tool schemas."""
DEFAULT_MAX_COMPLETION_TOKENS = 4096
"""The completion length a request without ``max_tokens`` is reserved for."""


@dataclass(frozen=True, slots=True)
class Pricing:
    """USD per million tokens of one endpoint. ``cached_input_per_mtok`` (``None``: the
    input price) applies to the prompt tokens the endpoint reports as cached."""

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None

    def __post_init__(self) -> None:
        for name in ("input_per_mtok", "output_per_mtok", "cached_input_per_mtok"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise InvalidArgumentError(f"{name} must be a finite number >= 0, got {value!r}")

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """The USD cost of one call's usage (cached tokens are part of ``prompt_tokens``)."""
        cached = min(max(cached_tokens, 0), prompt_tokens)
        cached_price = (
            self.input_per_mtok
            if self.cached_input_per_mtok is None
            else self.cached_input_per_mtok
        )
        return (
            (prompt_tokens - cached) * self.input_per_mtok
            + cached * cached_price
            + completion_tokens * self.output_per_mtok
        ) / PER_MTOK

    def worst_case(self, prompt_tokens_bound: int, max_completion_tokens: int) -> float:
        """The most a call can cost: every prompt token uncached, the full completion."""
        return (
            prompt_tokens_bound * max(self.input_per_mtok, self.cached_input_per_mtok or 0.0)
            + max_completion_tokens * self.output_per_mtok
        ) / PER_MTOK


def _text_bytes(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, list):  # content parts
        return sum(
            _text_bytes(part.get("text") if isinstance(part, dict) else part) for part in value
        )
    return len(str(value).encode("utf-8"))


def prompt_tokens_bound(messages: Messages, tools: list[dict[str, Any]] | None = None) -> int:
    """An upper bound of a request's prompt tokens without the model's tokenizer.

    Byte-level BPE tokenizers (GPT, Llama, Qwen...) never make more tokens than
    the text has UTF-8 bytes, so bytes plus a per-message template allowance bound
    the count from above; the reservation is released and the real usage billed
    once the response is in.
    """
    total = 0
    for message in messages:
        total += MESSAGE_OVERHEAD_TOKENS + _text_bytes(message.get("content"))
        for call in message.get("tool_calls") or []:
            total += _text_bytes(str(call))
    if tools:
        total += TOOLS_OVERHEAD_TOKENS + sum(_text_bytes(str(tool)) for tool in tools)
    return total


def requested_completion_tokens(sampling_args: dict[str, Any] | None) -> int | None:
    """The completion length a request asks for (``max_tokens`` /
    ``max_completion_tokens``), or ``None`` when it sets none."""
    args = sampling_args or {}
    extra = args.get("extra_body") or {}
    for source in (args, extra):
        for key in ("max_completion_tokens", "max_tokens"):
            value = source.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


def max_completion_tokens(sampling_args: dict[str, Any] | None) -> int:
    """The completion length a request may reach: its ``max_tokens`` /
    ``max_completion_tokens``, else :data:`DEFAULT_MAX_COMPLETION_TOKENS`."""
    requested = requested_completion_tokens(sampling_args)
    return DEFAULT_MAX_COMPLETION_TOKENS if requested is None else requested


def format_cost(usd: float | None) -> str:
    """``$0.0123`` (four significant decimals below a dollar), or ``unpriced``."""
    if usd is None:
        return "unpriced"
    if usd < 1:
        return f"${usd:.4f}"
    return f"${usd:,.2f}"
