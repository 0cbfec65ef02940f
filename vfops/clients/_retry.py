"""The retry policy of :class:`OpenAIClient`, kept separate so it is unit-testable.

Retried: HTTP 408, 429 and 5xx, timeouts, connection errors, and response bodies
that cannot be decoded. Not retried: any other 4xx. The delay before retry
``attempt`` (0-based) is exponential backoff with full jitter, capped at
``max_delay_s``; a server's ``Retry-After`` / ``retry-after-ms`` raises it
(never above ``max_delay_s``).
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp

from vfops.clients._errors import APIConnectionError, APIStatusError, MalformedResponseError

RETRYABLE_STATUS = frozenset({408, 429})


def parse_retry_after(
    headers: Mapping[str, str] | None, *, now: float | None = None
) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an
    HTTP-date); ``None`` when absent or unparsable. Never negative."""
    if headers is None:
        return None
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def status_of(exc: BaseException) -> int | None:
    """The HTTP status code carried by ``exc``, if any."""
    if isinstance(exc, APIStatusError):
        return exc.status_code
    if isinstance(exc, aiohttp.ClientResponseError):
        return exc.status
    return None


def retry_after_of(exc: BaseException) -> float | None:
    """The server-requested wait attached to ``exc`` (from its response headers)."""
    if isinstance(exc, APIStatusError):
        return exc.retry_after_s
    return None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many times, after which errors, and how long to wait between tries."""

    max_retries: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 60.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("delays must be >= 0")

    def backoff_cap(self, attempt: int) -> float:
        """The upper bound of the jittered backoff before retry ``attempt`` (0-based)."""
        return min(self.max_delay_s, self.base_delay_s * (2.0 ** min(attempt, 62)))

    def delay_for(self, attempt: int, retry_after_s: float | None = None) -> float:
        """Seconds to sleep before retry ``attempt`` (0 = the first retry)."""
        delay = self.rng.uniform(0.0, self.backoff_cap(attempt))
        if retry_after_s is not None:
            delay = max(delay, retry_after_s)
        return min(delay, self.max_delay_s)

    def is_retryable(self, exc: BaseException) -> bool:
        """True for transient failures: 408/429/5xx, timeouts, connection errors and
        undecodable bodies."""
        status = status_of(exc)
        if status is not None:
            return status in RETRYABLE_STATUS or status >= 500
        return isinstance(
            exc,
            APIConnectionError  # includes APITimeoutError
            | MalformedResponseError
            | aiohttp.ClientError
            | asyncio.TimeoutError
            | ConnectionError,
        )
