"""The retry policy of :class:`OpenAIClient`, kept separate so it is unit-testable.

Two kinds of retry, limited separately:

- **Rate limits that name their wait**: a 429 with ``Retry-After`` /
  ``retry-after-ms`` (or, from OpenAI, ``x-ratelimit-reset-*``) is the provider
  asking to slow down, not a failure. It is waited out (plus a little jitter, so
  requests told the same wait do not return at the same instant) for as long as
  the request's waits add up to no more than ``max_retry_wait_s``; it does not
  count as an attempt.
- **Transient failures**: HTTP 408, 5xx, a 429 without a wait, timeouts,
  connection errors and response bodies that cannot be decoded, retried up to
  ``max_retries`` times. The delay before retry ``attempt`` (0-based) is
  exponential backoff with full jitter, capped at ``max_delay_s``; a server's
  ``Retry-After`` raises it (never above ``max_delay_s``).
- **Timeouts** are transient failures too, but each one already took the full
  request timeout, so they are also limited by ``max_timeout_retries`` (default
  2, as the ``openai`` SDK retries): a hung endpoint fails a request after about
  three times the timeout rather than ``max_retries + 1`` times it (an hour per
  request at the defaults otherwise).

Any other 4xx is not retried.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vfops._errors import InvalidArgumentError
from vfops.clients._errors import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    MalformedResponseError,
)

if TYPE_CHECKING:
    import aiohttp

RETRYABLE_STATUS = frozenset({408, 429})

DEFAULT_MAX_RETRIES = 5
DEFAULT_MAX_TIMEOUT_RETRIES = 2
"""A request that timed out is retried twice (the ``openai`` SDK's retries): a
sporadic stall (a stuck replica, a dropped connection) is survived, while a hung
endpoint is not paid the full timeout ``max_retries + 1`` times. One retry was
measured too few: at 2 % random timeouts, a run of 200 rollouts lost one in four
times."""
DEFAULT_MAX_RETRY_WAIT_S = 300.0
"""Five minutes of rate-limit waits per request: a per-minute limit resets well
within it, while a spent daily quota (``Retry-After`` of hours) fails fast."""

RATE_LIMIT_MIN_WAIT_S = 0.05
"""A ``Retry-After: 0`` is waited this long, so a server that keeps answering it
is not hammered in a tight loop."""

RATE_LIMIT_JITTER = 0.2
"""Up to this fraction is added to a rate-limit wait (herds told the same wait spread out)."""

_RESET_HEADERS = (
    ("x-ratelimit-reset-requests", "x-ratelimit-remaining-requests"),
    ("x-ratelimit-reset-tokens", "x-ratelimit-remaining-tokens"),
)
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?)(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


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


def parse_duration(text: str) -> float | None:
    """Seconds in a Go-style duration (``"20ms"``, ``"1.5s"``, ``"6m0s"``, ``"1h2m3s"``)
    or a plain number of seconds; ``None`` when unparsable."""
    text = text.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _UNIT_S[unit] for number, unit in parts)


def parse_rate_limit_reset(headers: Mapping[str, str] | None) -> float | None:
    """Seconds until OpenAI's exhausted limit resets, from ``x-ratelimit-reset-requests``
    / ``-tokens``: the longest reset of the limits whose ``remaining`` is 0 (or not
    given); ``None`` when there is none."""
    if headers is None:
        return None
    waits: list[float] = []
    for reset_name, remaining_name in _RESET_HEADERS:
        reset = headers.get(reset_name)
        if reset is None or headers.get(remaining_name, "0").strip() not in ("0", ""):
            continue
        seconds = parse_duration(reset)
        if seconds is not None:
            waits.append(seconds)
    return max(waits) if waits else None


def _aiohttp_errors() -> tuple[type[aiohttp.ClientResponseError], type[aiohttp.ClientError]]:
    """aiohttp's response and base errors once it is imported, else two classes nothing
    is an instance of: no aiohttp error can exist before it is, so a process that never
    talks HTTP (the registry's, the tracker) never loads it."""
    module = sys.modules.get("aiohttp")
    if module is None:
        return (_NeverRaised, _NeverRaised)  # type: ignore[return-value]
    return (module.ClientResponseError, module.ClientError)


class _NeverRaised(Exception):
    """Stands for aiohttp's errors before aiohttp is imported (see above)."""


def status_of(exc: BaseException) -> int | None:
    """The HTTP status code carried by ``exc``, if any."""
    if isinstance(exc, APIStatusError):
        return exc.status_code
    if isinstance(exc, _aiohttp_errors()[0]):
        return exc.status
    return None


def retry_after_of(exc: BaseException) -> float | None:
    """The server-requested wait attached to ``exc`` (from its response headers)."""
    if isinstance(exc, APIStatusError):
        return exc.retry_after_s
    return None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many times, after which errors, and how long to wait between tries.

    ``max_retries``: retries of transient failures (5xx, timeouts, connection
    errors...). ``max_timeout_retries``: how many of those may be timeouts (each
    took the full request timeout). ``max_retry_wait_s``: the seconds one request
    may spend waiting out rate limits that name their wait (0: such a 429 is not
    retried either).
    """

    max_retries: int = DEFAULT_MAX_RETRIES
    max_timeout_retries: int = DEFAULT_MAX_TIMEOUT_RETRIES
    base_delay_s: float = 0.5
    max_delay_s: float = 60.0
    max_retry_wait_s: float = DEFAULT_MAX_RETRY_WAIT_S
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.max_timeout_retries < 0:
            raise InvalidArgumentError("max_retries and max_timeout_retries must be >= 0")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise InvalidArgumentError("delays must be >= 0")
        if not self.max_retry_wait_s >= 0:  # also rejects NaN
            raise InvalidArgumentError("max_retry_wait_s must be >= 0")

    def backoff_cap(self, attempt: int) -> float:
        """The upper bound of the jittered backoff before retry ``attempt`` (0-based)."""
        return min(self.max_delay_s, self.base_delay_s * (2.0 ** min(attempt, 62)))

    def delay_for(self, attempt: int, retry_after_s: float | None = None) -> float:
        """Seconds to sleep before retry ``attempt`` (0 = the first retry)."""
        delay = self.rng.uniform(0.0, self.backoff_cap(attempt))
        if retry_after_s is not None:
            delay = max(delay, retry_after_s)
        return min(delay, self.max_delay_s)

    def rate_limit_wait(self, exc: BaseException) -> float | None:
        """The wait a rate-limit error names (a 429 with a retry-after), else ``None``."""
        if status_of(exc) != 429:
            return None
        return retry_after_of(exc)

    def rate_limit_delay(self, wait_s: float) -> float:
        """Seconds to sleep for a rate limit that names ``wait_s``: never less than it."""
        return max(wait_s, RATE_LIMIT_MIN_WAIT_S) * (1.0 + self.rng.uniform(0.0, RATE_LIMIT_JITTER))

    @staticmethod
    def is_timeout(exc: BaseException) -> bool:
        """Whether ``exc`` is an attempt that waited the full timeout for nothing."""
        return isinstance(exc, APITimeoutError | TimeoutError)

    def is_retryable(self, exc: BaseException) -> bool:
        """True for transient failures: 408/429/5xx, timeouts, connection errors and
        undecodable bodies."""
        status = status_of(exc)
        if status is not None:
            return status in RETRYABLE_STATUS or status >= 500
        return isinstance(
            exc,
            (
                APIConnectionError,  # includes APITimeoutError
                MalformedResponseError,
                _aiohttp_errors()[1],
                asyncio.TimeoutError,
                ConnectionError,
            ),
        )


@dataclass(slots=True)
class RetryState:
    """The retries of one request under a :class:`RetryPolicy`.

    ``delay_after(exc)`` gives the seconds to sleep before the next try, or
    ``None`` to give up; ``gave_up_because`` then says why, for the error message.
    """

    policy: RetryPolicy
    retries: int = 0
    """Transient failures retried so far (limited by ``max_retries``)."""
    timeouts: int = 0
    """Timeouts retried so far (also limited by ``max_timeout_retries``)."""
    rate_limited: int = 0
    """Rate-limit waits so far (not counted as retries)."""
    waited_s: float = 0.0
    """Seconds of rate-limit waits so far (limited by ``max_retry_wait_s``)."""
    gave_up_because: str = ""

    def delay_after(self, exc: BaseException) -> float | None:
        policy = self.policy
        if not policy.is_retryable(exc):
            return None
        wait = policy.rate_limit_wait(exc)
        if wait is not None:
            delay = policy.rate_limit_delay(wait)
            if self.waited_s + delay > policy.max_retry_wait_s:
                self.gave_up_because = (
                    f"not waiting the {wait:g} s asked: over max_retry_wait_s "
                    f"({policy.max_retry_wait_s:g} s; {self.waited_s:.1f} s waited on "
                    f"{self.rate_limited} earlier rate limits)"
                )
                return None
            self.rate_limited += 1
            self.waited_s += delay
            return delay
        if self.retries >= policy.max_retries:
            if self.retries:
                self.gave_up_because = f"retried {self.retries} times (max_retries)"
            return None
        timed_out = policy.is_timeout(exc)
        if timed_out and self.timeouts >= policy.max_timeout_retries:
            self.gave_up_because = (
                f"timed out {self.timeouts + 1} times "
                f"(a request that times out is {_retried(policy.max_timeout_retries)})"
            )
            return None
        delay = policy.delay_for(self.retries, retry_after_of(exc))
        self.retries += 1
        self.timeouts += timed_out
        return delay


def _retried(times: int) -> str:
    if times == 0:
        return "not retried"
    return "retried once" if times == 1 else f"retried at most {times} times"
