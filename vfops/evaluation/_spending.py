"""What an evaluation may spend, and what it shares: the client's middleware.

A capped run reserves each priced request's worst case on the registry's ledger
(:class:`vfops.budget.RegistryLedger`); a run whose client learns the endpoint's
limit (:class:`vfops.budget.AdaptiveLimiter`) shares its pushbacks with the other
processes using the endpoint (:class:`vfops.budget.PeerSyncMiddleware`). Both wrap
the client (:mod:`vfops.clients._middleware`), set up here, in one place
(:func:`client_middleware`), instead of being threaded through the evaluation. The
ledger is a context variable as well as a middleware's: a judge's priced client,
which the evaluation never sees, reserves on it too.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING

from vfops._errors import VfopsError
from vfops.budget import AdaptiveLimiter
from vfops.costs import use_ledger

if TYPE_CHECKING:
    from vfops.budget import RegistryLedger
    from vfops.clients import ModelClient, RequestMiddleware
    from vfops.registry import RunStore


def check_caps(
    max_cost: float | None, cost_caps: Mapping[str, float | None] | None, *, registry: bool
) -> None:
    caps = {"max_cost": max_cost, **{f"cost cap {k!r}": v for k, v in (cost_caps or {}).items()}}
    for name, cap in caps.items():
        if cap is not None and not (math.isfinite(cap) and cap > 0):
            raise VfopsError(f"{name} must be a positive number of USD, got {cap}; e.g. 5.0")
    if (max_cost is not None or cost_caps) and not registry:
        raise VfopsError(
            "a cost cap needs the registry (its ledger is shared by every process); "
            "drop --no-registry or the cap"
        )


def check_priced(client: ModelClient | None, model: str) -> None:
    """Refuse a cost cap on a model without prices (``client`` None: one loaded
    in-process, which has none)."""
    if getattr(client, "pricing", None) is None:
        raise VfopsError(
            f"a cost cap needs prices for model {model!r}: set input_price_per_mtok and "
            "output_price_per_mtok (USD per million tokens) on its [[endpoint]] in "
            "endpoints.toml, or drop the cap"
        )


async def open_ledger(
    store: RunStore,
    run_id: str,
    max_cost: float | None,
    cost_caps: Mapping[str, float | None],
) -> RegistryLedger:
    from vfops.budget import RegistryLedger

    caps = {**cost_caps, run_scope(run_id): max_cost}
    await store.service.call("cost.set_caps", caps, run_id)
    return RegistryLedger(store.service, list(caps), run_id)


def run_scope(run_id: str) -> str:
    """The ledger scope of one run's own cap (``vfops eval --max-cost``)."""
    return f"run:{run_id}"


@contextlib.asynccontextmanager
async def client_middleware(
    client: ModelClient,
    store: RunStore | None,
    ledger: RegistryLedger | None,
    plugins: Sequence[RequestMiddleware] = (),
) -> AsyncIterator[None]:
    """While the run runs: priced requests (the client's and its judges') reserve on
    ``ledger``, the client's adaptive limiter shares pushbacks with other processes
    through the registry (:class:`vfops.budget.PeerSync`), and ``plugins`` (named
    request middleware from other packages) wrap every request."""
    from vfops.clients import installed_middleware as installed

    middlewares: list[RequestMiddleware] = list(plugins)
    limiter = getattr(client, "limiter", None)
    if store is not None and isinstance(limiter, AdaptiveLimiter) and limiter.name:
        from vfops.budget import PeerSyncMiddleware

        middlewares.append(PeerSyncMiddleware(limiter, store.service))
    with use_ledger(ledger):
        async with installed(client, *middlewares):
            yield
