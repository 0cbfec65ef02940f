"""Adaptive concurrency (issue 16 part 3): :class:`vfops.budget.AdaptiveLimiter`.

The controller is driven directly (permits entered and left with the outcomes an
:class:`OpenAIClient` attempt has: a return, a :class:`RateLimitError`), then over
real HTTP against the stub with a cap on requests in flight that the client is not
told. Assertions are on counts and limits, never on durations.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from vfops.budget import AdaptiveLimiter, LocalRequestLimiter
from vfops.clients import OpenAIClient, RateLimitError
from vfops.evaluation import ModelOptions
from vfops.evaluation._model import connect_model
from vfops.testing import StubConfig, StubServer

MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


def _rate_limited() -> RateLimitError:
    return RateLimitError(429, "Too many concurrent requests", retry_after_s=0.05)


class _Held:
    """``n`` permits entered at once, left one at a time with a chosen outcome."""

    def __init__(self, limiter: AdaptiveLimiter) -> None:
        self.limiter = limiter
        self.permits: list[contextlib.AbstractAsyncContextManager[None]] = []

    async def enter(self, n: int) -> None:
        for _ in range(n):
            permit = self.limiter.acquire()
            await permit.__aenter__()
            self.permits.append(permit)

    async def succeed(self, n: int = 1) -> None:
        for _ in range(n):
            await self.permits.pop().__aexit__(None, None, None)

    async def reject(self, n: int = 1) -> None:
        for _ in range(n):
            exc = _rate_limited()
            await self.permits.pop().__aexit__(type(exc), exc, None)


async def _saturate(limiter: AdaptiveLimiter, successes: int, *, workers: int) -> None:
    """``workers`` tasks each taking permits and succeeding, ``successes`` in all
    (give or take the ones already admitted when the last one was counted)."""
    done = 0

    async def worker() -> None:
        nonlocal done
        while done < successes:
            async with limiter.acquire():
                await asyncio.sleep(0)
            done += 1

    await asyncio.gather(*(worker() for _ in range(workers)))


async def _succeed_at_full_limit(held: _Held, n: int) -> None:
    """``n`` successes, each with the limit full (the limit is what holds requests back)."""
    for _ in range(n):
        limit = held.limiter.limit
        assert limit is not None
        await held.enter(max(0, int(limit) - held.limiter.in_flight))
        await held.succeed(1)


async def test_no_cap_and_no_waiting_until_the_endpoint_pushes_back() -> None:
    limiter = AdaptiveLimiter()
    held = _Held(limiter)
    await held.enter(500)
    await held.succeed(500)
    assert limiter.limit is None
    assert (limiter.waited, limiter.max_in_flight, limiter.succeeded) == (0, 500, 500)
    assert limiter.decreases == 0


async def test_a_burst_of_429s_from_one_overload_is_one_decrease_from_what_got_through() -> None:
    # 100 sent at once to an endpoint holding 24: 76 come back 429 at once
    limiter = AdaptiveLimiter()
    held = _Held(limiter)
    await held.enter(100)
    await held.reject(76)
    assert limiter.rate_limited == 76
    assert limiter.decreases == 1
    # backoff (0.9) times the 24 still in flight, not 0.9 ** 76 nor 0.9 * 100
    assert limiter.limit == pytest.approx(0.9 * 24)
    await held.succeed(24)
    assert limiter.decreases == 1

    # a 429 on a request admitted after the decrease is a new overload: one more
    await held.enter(21)
    await held.reject(1)
    assert limiter.decreases == 2
    assert limiter.limit == pytest.approx(0.9 * 20)
    await held.succeed(20)


async def test_additive_increase_is_one_per_limit_of_successes_and_slower_near_the_drop() -> None:
    limiter = AdaptiveLimiter(initial_limit=10)
    held = _Held(limiter)
    await _succeed_at_full_limit(held, 10)  # ~ one round trip's worth at limit 10
    assert limiter.limit is not None and 10.9 < limiter.limit < 11.0
    assert limiter.max_in_flight == 10
    await held.succeed(len(held.permits))

    # the endpoint held 30: the limit drops to 27 and probes 29..31 8x slower
    limiter = AdaptiveLimiter()
    held = _Held(limiter)
    await held.enter(31)
    await held.reject(1)
    await held.succeed(30)
    assert limiter.limit == pytest.approx(27.0)
    fast = 0
    while (limiter.limit or 0.0) < 28.0:
        await _succeed_at_full_limit(held, 1)
        fast += 1  # 27 -> 28: about 27 successes
    while (limiter.limit or 0.0) < 29.0:
        await _succeed_at_full_limit(held, 1)
    slow = 0
    while (limiter.limit or 0.0) < 30.0:
        await _succeed_at_full_limit(held, 1)
        slow += 1  # 29 -> 30 is in the band around 30: about 8 x 29
    assert 20 <= fast <= 30
    assert slow > 6 * fast


async def test_no_increase_while_the_limit_is_not_what_holds_requests_back() -> None:
    limiter = AdaptiveLimiter(initial_limit=10)
    await _saturate(limiter, 200, workers=3)
    assert limiter.limit == 10.0
    assert limiter.waited == 0


async def test_an_explicit_limit_caps_the_adaptive_one() -> None:
    limiter = AdaptiveLimiter(max_limit=8)
    assert limiter.limit == 8.0
    await _saturate(limiter, 400, workers=40)
    assert limiter.limit == 8.0  # success never raises it past the explicit limit
    assert limiter.max_in_flight == 8
    with pytest.raises(ValueError, match="backoff"):
        AdaptiveLimiter(backoff=1.0)


async def test_connect_model_uses_one_adaptive_limiter_per_endpoint_unless_told_otherwise() -> None:
    with StubServer(StubConfig()) as server:

        async def limiter_of(options: ModelOptions) -> object:
            connection = await connect_model("stub-model", options)
            client = connection.client
            assert isinstance(client, OpenAIClient)
            await client.aclose()
            return client.limiter

        default = await limiter_of(ModelOptions(base_url=server.base_url))
        assert isinstance(default, AdaptiveLimiter)
        assert await limiter_of(ModelOptions(base_url=server.base_url)) is default
        explicit = LocalRequestLimiter(max_concurrent=4)
        assert await limiter_of(ModelOptions(base_url=server.base_url, limiter=explicit)) is (
            explicit
        )
        off = ModelOptions(base_url=server.base_url, adaptive_concurrency=False)
        assert await limiter_of(off) is None


async def _run_requests(client: OpenAIClient, n: int, concurrency: int) -> None:
    remaining = n

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            response = await client.chat(model="stub-model", messages=MESSAGES)
            assert response.message["content"]

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def test_over_http_the_limit_converges_near_an_unknown_in_flight_cap_with_few_429s() -> None:
    cap, concurrency, n = 8, 48, 800
    limiter = AdaptiveLimiter()
    with StubServer(StubConfig(latency_ms=50, max_in_flight=cap)) as server:
        async with OpenAIClient(server.base_url, limiter=limiter) as client:
            await _run_requests(client, n, concurrency)
        stats = server.stats
    assert stats["ok"] == n
    assert stats["max_active"] == cap  # the cap was reached: the client found it, not less
    # the first burst (48 sent into a cap of 8) is one overload; after it, 429s are rare
    assert stats["429"] == limiter.rate_limited
    assert stats["429"] <= (concurrency - cap) + 0.03 * n
    assert limiter.decreases <= 1 + 0.03 * n
    assert limiter.limit is not None and 0.7 * cap <= limiter.limit <= cap + 2
    assert limiter.max_in_flight == concurrency  # no slow start: all 48 went out first


async def test_a_fixed_limit_above_the_cap_gets_many_more_429s() -> None:
    # the counterpart of the previous test: what the adaptive limit saves
    cap, n = 8, 400
    with StubServer(StubConfig(latency_ms=50, max_in_flight=cap)) as server:
        limiter = LocalRequestLimiter(max_concurrent=2 * cap)
        async with OpenAIClient(server.base_url, limiter=limiter) as client:
            await _run_requests(client, n, 48)
        stats = server.stats
    assert stats["ok"] == n
    assert stats["in_flight_limited"] == stats["429"] > n  # more 429s than answers


@contextlib.asynccontextmanager
async def _hog_the_event_loop(block_s: float, pause_s: float) -> AsyncIterator[None]:
    """Client CPU load: the event loop is blocked ``block_s`` out of every
    ``block_s + pause_s`` (a CPU-bound client), while the endpoint's latency is constant."""
    stop = asyncio.Event()

    async def hog() -> None:
        while not stop.is_set():
            until = time.perf_counter() + block_s
            while time.perf_counter() < until:
                pass
            await asyncio.sleep(pause_s)

    task = asyncio.create_task(hog())
    try:
        yield
    finally:
        stop.set()
        await task


async def test_the_latency_signal_ignores_client_cpu_load_on_a_constant_latency_endpoint() -> None:
    limiter = AdaptiveLimiter(initial_limit=16, latency_tolerance=2.0)
    with StubServer(StubConfig(latency_ms=50), subprocess=True) as server:
        async with OpenAIClient(server.base_url, limiter=limiter) as client:
            await _run_requests(client, 64, 16)  # the minimum latency, unloaded
            async with _hog_the_event_loop(block_s=0.2, pause_s=0.05):
                await _run_requests(client, 300, 16)
    snapshot = limiter.snapshot()
    # the client's own queueing did raise what it measured well past 2x the minimum...
    assert snapshot["smoothed_latency_s"] > 2 * snapshot["min_latency_s"], snapshot
    # ...but it is not the endpoint's, so no decrease
    assert limiter.latency_decreases == 0 and limiter.decreases == 0, snapshot
    assert limiter.limit is not None and limiter.limit >= 16


async def test_the_latency_signal_decreases_when_the_endpoints_latency_climbs() -> None:
    limiter = AdaptiveLimiter(initial_limit=16, latency_tolerance=2.0)
    # 50 ms, not less: the stub shares this process, and on a busy machine a stall of
    # a few tens of ms at 20 ms doubled a request's latency (a decrease, once in a full
    # suite run beside the second pass on slow cores)
    with StubServer(StubConfig(latency_ms=50)) as server:
        async with OpenAIClient(server.base_url, limiter=limiter) as client:
            await _run_requests(client, 160, 16)
            assert limiter.latency_decreases == 0
            server.config.latency_ms = 500  # the in-process stub reads it per request
            await _run_requests(client, 64, 16)
    assert limiter.latency_decreases >= 1
    assert limiter.limit is not None and limiter.limit < 16


# --- across processes: pushbacks through the registry -------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def registry_engine(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    from tests.registry_fixtures import database_url
    from vfops.registry import get_engine

    for url in database_url(request.param, tmp_path):
        yield get_engine(url)


async def test_a_pushback_one_process_sees_makes_the_others_back_off(
    registry_engine: Any,
) -> None:
    """Two limiters of one endpoint, each with its own PeerSync over the registry (as in
    two processes): A's 429 decrease is told through the registry, and B, which hears
    it, stops probing upward (its requests admitted so far raise nothing) without a
    decrease of its own; news is heard once, one's own report is not news to it, and a
    process joining later starts from half of A's limit instead of no cap."""
    from vfops.budget import PeerSync
    from vfops.registry import ThreadService

    calls = ThreadService(registry_engine)
    endpoint = "http://api.example/v1 big-model"
    a = AdaptiveLimiter(name=endpoint)
    b = AdaptiveLimiter(name=endpoint, initial_limit=12)
    control = AdaptiveLimiter(name="control", initial_limit=12)  # hears nothing
    other = AdaptiveLimiter(name="http://other.example/v1 m", initial_limit=12)
    syncs = [PeerSync(limiter, calls, interval_s=3600) for limiter in (a, b, other)]
    for sync in syncs:
        await sync.start()
    sync_a, sync_b, sync_other = syncs
    held = {name: _Held(lim) for name, lim in (("a", a), ("b", b), ("c", control), ("o", other))}
    await held["a"].enter(20)
    for name in ("b", "c", "o"):
        await held[name].enter(12)  # at their limit
    await held["a"].reject()  # A is pushed back: 19 still in flight
    assert a.decreases == 1 and a.limit == pytest.approx(0.9 * 19)

    await sync_b.step()  # nothing reported yet
    assert sync_b.heard == 0 and b.peer_holds == 0
    await sync_a.step()  # A tells
    await sync_a.step()  # ... and does not hear itself
    assert sync_a.told == 1 and sync_a.heard == 0 and a.decreases == 1
    await sync_b.step()  # B hears: it holds
    assert sync_b.heard == 1 and b.peer_holds == 1 and b.decreases == 0
    await sync_b.step()  # the same news is heard once
    assert b.peer_holds == 1
    for name in ("b", "c"):
        await held[name].succeed(1)  # a success with the limit full
    assert b.limit == 12  # held: its requests from before the news raise nothing
    assert control.limit is not None and control.limit > 12  # the control probes up
    await sync_b.step()  # B, which got no 429 itself, tells nothing
    await sync_a.step()
    assert a.peer_holds == 0
    await sync_other.step()  # another endpoint's pushbacks are another matter
    assert sync_other.heard == 0 and other.peer_holds == 0

    idle = AdaptiveLimiter(name=endpoint)  # nothing in flight: nothing to hold
    assert not idle.peer_pushback() and idle.limit is None
    joining = PeerSync(idle, calls, interval_s=3600)
    await joining.start()
    assert joining.adopted and idle.limit == pytest.approx(0.9 * 19 / 2)
    stranger = AdaptiveLimiter(name="http://new.example/v1 m")  # nobody pushed back there
    fresh = PeerSync(stranger, calls, interval_s=3600)
    await fresh.start()
    assert not fresh.adopted and stranger.limit is None
    for sync in (joining, fresh):
        await sync.aclose()
    for permits in held.values():
        await permits.succeed(len(permits.permits))
    for sync in syncs:
        await sync.aclose()


def test_vfops_eval_tells_the_registry_when_the_endpoint_pushes_back(tmp_path: Any) -> None:
    """The wiring: an eval whose endpoint answers 429 above 4 requests in flight records
    the pushback for other processes (the endpoint's epoch moves), and still completes."""
    import subprocess
    import sys

    from vfops.registry import get_engine, pushback_epoch, session_scope

    url = f"sqlite:///{tmp_path / 'registry.db'}"
    with StubServer(StubConfig(reply_mode="arithmetic", latency_ms=50, max_in_flight=4)) as stub:
        done = subprocess.run(
            [sys.executable, "-m", "vfops", "eval", "arithmetic", "-m", "stub-model",
             "-b", stub.base_url, "-n", "60", "-r", "2", "-c", "32", "-q",
             "-o", str(tmp_path / "out")],
            capture_output=True, text=True, timeout=300, check=False,
            env={"PATH": "/usr/bin:/bin", "VFOPS_DATABASE_URL": url, "VFOPS_TRACKING": "0",
                 "VFOPS_HOME": str(tmp_path / "home")},
        )  # fmt: skip
        rejected = stub.stats["429"]
    assert done.returncode == 0, done.stderr
    assert rejected > 0  # the endpoint did push back
    with session_scope(get_engine(url), write=False) as session:
        epoch = pushback_epoch(session, f"{stub.base_url.rstrip('/')} stub-model")
    assert epoch >= 1


class _RecordingCalls:
    """Registry calls that answer "no pushbacks yet" and fail once closed (an
    evaluation's calls close when it ends)."""

    def __init__(self) -> None:
        self.closed = False
        self.used = 0

    async def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.closed:
            raise RuntimeError("these calls are closed")
        self.used += 1
        return (0, None, None)

    async def aclose(self) -> None:
        self.closed = True


def test_evaluations_on_two_event_loops_sharing_a_limiter_each_keep_their_own_sync(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sweep's cells run in threads with loops of their own and share one limiter per
    endpoint. Cell A enters, cell B enters, A leaves, B leaves: a sync shared across the
    loops had B await A's loop's task ("attached to a different loop", seen in CI);
    each loop now has its own, and both leave cleanly."""
    import threading

    from vfops.budget import peer_sync

    monkeypatch.setenv("VFOPS_PEER_SYNC_S", "0.01")
    limiter = AdaptiveLimiter(name="http://api.example/v1 m")
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []
    syncs: dict[str, Any] = {}

    def cell(name: str, entered: threading.Event, wait_for: threading.Event) -> None:
        async def run() -> None:
            async with peer_sync(limiter, _RecordingCalls()) as sync:
                syncs[name] = sync
                entered.set()
                await asyncio.to_thread(wait_for.wait, 10)

        try:
            asyncio.run(run())
        except BaseException as exc:
            errors.append(exc)
        finally:
            if name == "a":
                a_out.set()

    a = threading.Thread(target=cell, args=("a", a_in, b_in))
    a.start()
    assert a_in.wait(10)
    b = threading.Thread(target=cell, args=("b", b_in, a_out))
    b.start()
    a.join(10)
    b.join(10)
    assert not errors, errors
    assert syncs["a"] is not syncs["b"]


async def test_a_shared_sync_goes_on_through_an_evaluation_still_inside(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two evaluations on one loop share a sync; when the first leaves (its calls close),
    the sync looks through the second's."""
    from vfops.budget import peer_sync

    monkeypatch.setenv("VFOPS_PEER_SYNC_S", "0.01")
    limiter = AdaptiveLimiter(name="http://api.example/v1 m")
    first, second = _RecordingCalls(), _RecordingCalls()
    leave_first = asyncio.Event()

    async def evaluation(calls: _RecordingCalls, until: asyncio.Event | None) -> Any:
        async with peer_sync(limiter, calls) as sync:
            if until is not None:
                await until.wait()
            else:
                await asyncio.sleep(0.05)
                leave_first.set()
                await asyncio.sleep(0.1)  # the first has left and closed its calls
                assert sync is not None and sync.calls is second
            return sync

    async def first_evaluation() -> Any:
        try:
            return await evaluation(first, leave_first)
        finally:
            await first.aclose()

    one, two = await asyncio.gather(first_evaluation(), evaluation(second, None))
    assert one is two
    assert second.used > 0  # the looks after the first left went through the second's calls
