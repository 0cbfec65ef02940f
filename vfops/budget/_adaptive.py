"""Adaptive request concurrency: find an endpoint's limit instead of being told it.

Providers cap requests in flight (or per second) and answer 429 above the cap; the
cap is rarely published and changes with load. :class:`AdaptiveLimiter` learns it
from the answers, the way TCP learns a path's capacity (AIMD, Chiu & Jain 1989):

- **No cost until the endpoint pushes back.** It starts with no cap (or
  ``initial_limit``) and no slow start: against an endpoint that never answers
  429, admission is a counter increment, so a fast run is not slowed.
- **Multiplicative decrease on a 429**, from the number of requests *still in
  flight* when the 429 comes back (not from the limit, which may be far above what
  the endpoint holds): ``limit = backoff * (in_flight - 1)``. The gentle
  ``backoff`` (0.9, not TCP's 0.5) fits a cap on requests in flight: the requests
  that got through are the endpoint's capacity, so the drop only has to get below
  it. A burst of 429s from one overload is **one** decrease: a 429 on a request
  admitted before the last decrease opens no new decrease (TCP's one reduction per
  window); it only lowers the limit to ``backoff`` times the requests still in
  flight, so the limit never compounds below ``backoff`` times what the endpoint
  accepted.
- **Additive increase on success**: ``+1/limit`` per success of a request admitted
  since the last decrease while the limit is the bottleneck (requests waiting, or
  the limit full), i.e. about +1 per round-trip's worth of successes, counted, not
  timed. Within ``max(1, PROBE_BAND * w_max)`` of the last drop point (``w_max``,
  the requests in flight that the endpoint held), the increase is
  ``probe_slowdown`` times slower: that is where the next 429 is, and probing it
  slowly makes 429s rare (measured: one per ~450 requests at a cap of 24) while
  the limit stays within a request or two of the cap. Past that band it climbs at
  the normal pace again, so a raised cap is found. Random 429s (a quota, not a
  cap) settle the limit where decreases and increases balance, as TCP does under
  random loss.
- **Latency (optional, ``latency_tolerance``)**: a decrease also when the smoothed
  latency exceeds ``latency_tolerance`` times the minimum observed (queueing at
  the endpoint). A client measures its own event loop's queueing too, which grows
  with concurrency when the client is CPU-bound even against a constant-latency
  endpoint; so a rise that the event loop's own lag (the recent lateness of a
  timer, decaying over ``LAG_DECAY_S``) could explain by ``LAG_HOPS`` loop turns
  is ignored. Off by default: 429s are the signal providers give.

``max_limit`` is an explicit cap (a budget's ``max_concurrent``): the learned
limit never goes above it. Counters (:meth:`snapshot`) are for metrics and benches.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from types import TracebackType
from typing import Any

from vfops._errors import InvalidArgumentError
from vfops.clients import APIStatusError

DEFAULT_BACKOFF = 0.9
DEFAULT_PROBE_SLOWDOWN = 8.0
PROBE_BAND = 0.05
"""The slow-probing band around ``w_max``: ``max(1, PROBE_BAND * w_max)`` requests."""
LAG_HOPS = 8.0
"""Event-loop turns a response may take in the client: a latency rise below
``LAG_HOPS`` times the measured loop lag is the client's own queueing."""
LAG_PROBE_S = 0.02
"""Interval of the event-loop lag timer (only with the latency signal on)."""
LAG_DECAY_S = 1.0
LATENCY_ALPHA = 0.1
"""Weight of a new sample in the smoothed latency."""
MIN_LATENCY_WINDOW = 512
"""Samples per bucket of the windowed minimum latency (two buckets are kept), so the
minimum follows a changed route instead of holding one lucky sample forever."""


def _is_overload(exc: BaseException | None) -> bool:
    return isinstance(exc, APIStatusError) and exc.status_code == 429


class _Permit:
    """The context manager :meth:`AdaptiveLimiter.acquire` returns (one per attempt)."""

    __slots__ = ("_limiter", "_seq", "_start")

    def __init__(self, limiter: AdaptiveLimiter) -> None:
        self._limiter = limiter
        self._seq = 0
        self._start = 0.0

    async def __aenter__(self) -> None:
        limiter = self._limiter
        await limiter._admit()
        limiter._seq += 1
        self._seq = limiter._seq
        if limiter.latency_tolerance is not None:
            self._start = time.monotonic()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._limiter._release(self._seq, self._start, exc_type, exc)


class AdaptiveLimiter:
    """A :class:`vfops.clients.RequestLimiter` whose concurrency limit adapts to the
    endpoint's 429s (and, optionally, its latency); see the module docstring.

    ``initial_limit``: the starting cap (``None``: no cap until the first 429).
    ``max_limit``: an explicit cap the limit never exceeds. ``min_limit``: the floor.
    ``backoff``: the multiplicative decrease. ``probe_slowdown``: how much slower
    the limit grows near the last drop point. ``latency_tolerance``: decrease when
    smoothed latency exceeds this multiple of the minimum (``None``: off).

    Usable from one event loop at a time; moved to a new loop (e.g. a second
    ``asyncio.run``), it keeps the learned limit and starts its bookkeeping afresh.
    """

    def __init__(
        self,
        *,
        initial_limit: int | None = None,
        max_limit: int | None = None,
        min_limit: int = 1,
        backoff: float = DEFAULT_BACKOFF,
        probe_slowdown: float = DEFAULT_PROBE_SLOWDOWN,
        latency_tolerance: float | None = None,
        name: str | None = None,
    ) -> None:
        if min_limit < 1:
            raise InvalidArgumentError(f"min_limit must be at least 1, got {min_limit}")
        for label, value in (("initial_limit", initial_limit), ("max_limit", max_limit)):
            if value is not None and value < min_limit:
                raise InvalidArgumentError(
                    f"{label} must be at least min_limit ({min_limit}), got {value}"
                )
        if not 0.0 < backoff < 1.0:
            raise InvalidArgumentError(
                f"backoff must be between 0 and 1 (exclusive), got {backoff}"
            )
        if not probe_slowdown >= 1.0:
            raise InvalidArgumentError(f"probe_slowdown must be at least 1, got {probe_slowdown}")
        if latency_tolerance is not None and not latency_tolerance > 1.0:
            raise InvalidArgumentError(
                f"latency_tolerance must be above 1, got {latency_tolerance}"
            )
        self.name = name
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.backoff = backoff
        self.probe_slowdown = probe_slowdown
        self.latency_tolerance = latency_tolerance
        start = initial_limit if initial_limit is not None else max_limit
        self._limit: float = math.inf if start is None else float(start)
        self._cap: float = self._cap_of(self._limit)
        self._w_max = math.inf
        self._in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._seq = 0
        self._window_seq = 0
        """Requests admitted up to the last decrease; their 429s open no new decrease."""
        # latency signal
        self._min_latency = math.inf
        self._min_buckets = [math.inf, math.inf]
        self._bucket_count = 0
        self._smoothed: float | None = None
        self._lag = 0.0
        self._lag_at = 0.0
        self._lag_timer: asyncio.TimerHandle | None = None
        # counters
        self.acquired = 0
        """Request attempts admitted."""
        self.succeeded = 0
        """Attempts that ended without an exception."""
        self.rate_limited = 0
        """429 answers seen."""
        self.decreases = 0
        """Multiplicative decreases (at most one per window), on 429s or latency."""
        self.latency_decreases = 0
        """Of :attr:`decreases`, those the latency signal made."""
        self.waited = 0
        """Admissions that had to wait for a free slot."""
        self.peer_holds = 0
        """Holds made on another process's pushback (:meth:`peer_pushback`)."""
        self.max_in_flight = 0
        """The most requests this limiter held in flight at once."""

    def __repr__(self) -> str:
        return (
            f"AdaptiveLimiter(name={self.name!r}, limit={self.limit}, "
            f"max_limit={self.max_limit}, decreases={self.decreases})"
        )

    def _cap_of(self, limit: float) -> float:
        if math.isinf(limit):
            return limit
        return float(max(self.min_limit, int(limit)))

    @property
    def limit(self) -> float | None:
        """The current concurrency limit (``None``: no cap yet); admission allows
        ``floor(limit)`` requests in flight."""
        return None if math.isinf(self._limit) else self._limit

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def snapshot(self) -> dict[str, Any]:
        """The counters, for metrics and benches."""
        return {
            "limit": self.limit,
            "in_flight": self._in_flight,
            "max_in_flight": self.max_in_flight,
            "acquired": self.acquired,
            "succeeded": self.succeeded,
            "rate_limited": self.rate_limited,
            "decreases": self.decreases,
            "latency_decreases": self.latency_decreases,
            "waited": self.waited,
            "peer_holds": self.peer_holds,
            "min_latency_s": None if math.isinf(self._min_latency) else self._min_latency,
            "smoothed_latency_s": self._smoothed,
        }

    def acquire(self) -> _Permit:
        return _Permit(self)

    # -- admission ---------------------------------------------------------------

    def _bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        # a new loop: the old one's requests and waiters are gone; the limit stays
        self._loop = loop
        self._in_flight = 0
        self._waiters = deque()
        self._lag_timer = None

    async def _admit(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._bind_loop(loop)
        if self._in_flight < self._cap and not self._waiters:
            self._in_flight += 1
        else:
            self.waited += 1
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append(future)
            try:
                await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    self._in_flight -= 1  # handed a slot while being cancelled
                    self._wake()
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(future)
                raise
        self.acquired += 1
        if self._in_flight > self.max_in_flight:
            self.max_in_flight = self._in_flight
        if self.latency_tolerance is not None and self._lag_timer is None:
            self._start_lag_probe(loop)

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters and self._in_flight < self._cap:
            future = waiters.popleft()
            if future.done():
                continue
            self._in_flight += 1
            future.set_result(None)

    def _release(
        self,
        seq: int,
        start: float,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
    ) -> None:
        in_flight = self._in_flight  # this request included
        if exc_type is None:
            self.succeeded += 1
            if self.latency_tolerance is not None and self._latency_says_decrease(
                time.monotonic() - start, seq
            ):
                self.latency_decreases += 1
                self._decrease(in_flight - 1, new_window=True)
            elif seq > self._window_seq and (in_flight >= self._cap or self._waiters):
                # admitted under the current limit, and the limit is full: probe up
                # (requests from before a decrease say nothing about the new limit)
                self._increase()
        elif _is_overload(exc):
            self.rate_limited += 1
            self._decrease(in_flight - 1, new_window=seq > self._window_seq)
        self._in_flight = in_flight - 1
        if self._waiters:
            self._wake()

    # -- the controller ------------------------------------------------------------

    def _set_limit(self, limit: float) -> None:
        if self.max_limit is not None:
            limit = min(limit, float(self.max_limit))
        self._limit = max(float(self.min_limit), limit)
        self._cap = self._cap_of(self._limit)

    def _decrease(self, survivors: int, *, new_window: bool) -> None:
        """``survivors``: the requests still in flight besides the one that failed."""
        target = self.backoff * max(survivors, self.min_limit)
        if new_window:
            self.decreases += 1
            self._window_seq = self._seq
            self._w_max = float(max(survivors, self.min_limit))
        elif target >= self._limit:
            return
        else:  # another 429 of the same overload: fewer got through than first seen
            self._w_max = min(self._w_max, float(max(survivors, self.min_limit)))
        self._set_limit(min(self._limit, target))

    @property
    def own_decreases(self) -> int:
        """Decreases this limiter made on its own answers (what it tells its peers)."""
        return self.decreases

    def peer_pushback(self) -> bool:
        """Another process using the endpoint was pushed back (its 429s): the cap it hit
        is this process's too. Hold: probe no further from here for now (requests admitted
        until now count for no increase, and the next steps are the slow ones near the
        drop point), without a decrease of its own: this process's own 429s say whether
        its share is too large (measured: a decrease in every process on any one's 429
        cost 10 % of throughput and saved no 429s, bench/adaptive_peers.py). An idle or
        uncapped limiter has nothing to hold (capping an uncapped one at what it held
        when the news came starved it: x0.79); whether it held."""
        if self._in_flight < 1 or math.isinf(self._limit):
            return False
        self.peer_holds += 1
        self._window_seq = self._seq
        self._w_max = self._limit
        return True

    def adopt_peer_limit(self, limit: float) -> bool:
        """Start from what a peer learned (its limit after its last pushback) instead of
        no cap: a process joining an endpoint that others already fill skips most of its
        discovery burst (C - X 429s). Only a limiter that has learned nothing yet adopts
        it, and it probes upward from there as usual; whether it adopted."""
        if not math.isinf(self._limit) or self.decreases or limit < self.min_limit:
            return False
        self._set_limit(float(limit))
        # w_max stays unknown: from a share of the peer's limit it climbs at the normal
        # pace to its own (slow probing from there cost 7 % of throughput)
        return True

    def _increase(self) -> None:
        limit = self._limit
        if math.isinf(limit) or (self.max_limit is not None and limit >= self.max_limit):
            return
        step = 1.0
        w_max = self._w_max
        if not math.isinf(w_max) and abs(limit - w_max) <= max(1.0, PROBE_BAND * w_max):
            step /= self.probe_slowdown  # near the last drop point: probe it slowly
        self._set_limit(limit + step / limit)

    # -- the latency signal --------------------------------------------------------

    def _latency_says_decrease(self, sample: float, seq: int) -> bool:
        buckets = self._min_buckets
        if sample < buckets[1]:
            buckets[1] = sample
        self._bucket_count += 1
        if self._bucket_count >= MIN_LATENCY_WINDOW:
            buckets[0], buckets[1] = buckets[1], math.inf
            self._bucket_count = 0
        self._min_latency = min(buckets)
        smoothed = self._smoothed
        smoothed = sample if smoothed is None else smoothed + LATENCY_ALPHA * (sample - smoothed)
        self._smoothed = smoothed
        assert self.latency_tolerance is not None
        excess = smoothed - self._min_latency
        if smoothed <= self.latency_tolerance * self._min_latency or seq <= self._window_seq:
            return False
        # a rise the client's own event loop could explain is not the endpoint's
        return excess > LAG_HOPS * self._lag

    def _start_lag_probe(self, loop: asyncio.AbstractEventLoop) -> None:
        """Measure how late a timer fires (the event loop's own queueing) while
        requests are in flight: ``_lag`` holds the latest lateness and decays with
        time constant ``LAG_DECAY_S``, so one long loop turn suspends the latency
        signal for a while. Stops by itself when the limiter is idle."""

        def fire(due: float) -> None:
            now = loop.time()
            elapsed = now - self._lag_at
            self._lag = max(now - due, self._lag * math.exp(-elapsed / LAG_DECAY_S))
            self._lag_at = now
            if self._in_flight == 0 or loop is not self._loop:
                self._lag_timer = None
                return
            self._lag_timer = loop.call_at(now + LAG_PROBE_S, fire, now + LAG_PROBE_S)

        due = loop.time() + LAG_PROBE_S
        self._lag_at = loop.time()
        self._lag_timer = loop.call_at(due, fire, due)


_SHARED: dict[str, AdaptiveLimiter] = {}


def shared_adaptive_limiter(key: str) -> AdaptiveLimiter:
    """The process's one :class:`AdaptiveLimiter` for endpoint ``key`` (e.g. its base
    URL and model), created on first use: every client of one endpoint in a process
    (the cells of a sweep, a judge and the policy) shares what it learned, and one
    endpoint's cap is one limit."""
    limiter = _SHARED.get(key)
    if limiter is None:
        limiter = _SHARED[key] = AdaptiveLimiter(name=key)
    return limiter
