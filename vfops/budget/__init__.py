"""The model-call budget shared by everything: one rate/concurrency budget per endpoint.

Budgets are Prefect global concurrency limits (:func:`ensure_limits`,
:class:`PrefectRequestLimiter`), so sweeps, judge scoring and training rollouts on
any worker cannot exceed an API's limit together; :class:`LocalRequestLimiter`
is the same for one process without Prefect; :class:`AdaptiveLimiter` learns an
endpoint's concurrency limit from its 429s when none is configured, and
:class:`PeerSync` shares what it learns with every process using the endpoint,
through the registry. A limiter is attached to a client with
``OpenAIClient(..., limiter=...)``. Importing this package does not import Prefect
(nor pydantic: the exports load on first use).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vfops.budget._adaptive import AdaptiveLimiter, shared_adaptive_limiter
    from vfops.budget._config import (
        BUDGETS_ENV_VAR,
        Budget,
        budget_for,
        budgets_path,
        limit_name,
        load_budgets,
        rate_limit_batch,
        rate_limit_name,
    )
    from vfops.budget._limiter import LocalRequestLimiter, Pacer
    from vfops.budget._peer import PEER_SYNC_S, PeerSync, peer_sync
    from vfops.budget._prefect import (
        LimitsInfo,
        PrefectRequestLimiter,
        ensure_limits,
        prefect_limiter,
        read_rate_limit,
    )
    from vfops.clients._openai import RequestLimiter

_MODULES = {
    "vfops.budget._adaptive": ("AdaptiveLimiter", "shared_adaptive_limiter"),
    "vfops.budget._config": (
        "BUDGETS_ENV_VAR",
        "Budget",
        "budget_for",
        "budgets_path",
        "limit_name",
        "load_budgets",
        "rate_limit_batch",
        "rate_limit_name",
    ),
    "vfops.budget._limiter": ("LocalRequestLimiter", "Pacer"),
    "vfops.budget._peer": ("PEER_SYNC_S", "PeerSync", "peer_sync"),
    "vfops.budget._prefect": (
        "LimitsInfo",
        "PrefectRequestLimiter",
        "ensure_limits",
        "prefect_limiter",
        "read_rate_limit",
    ),
    "vfops.clients._openai": ("RequestLimiter",),
}
_SOURCE = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    # Exports load on first use: the adaptive limiter (used by every evaluation)
    # needs neither pydantic (budgets.toml's models) nor anything else here.
    module = _SOURCE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "BUDGETS_ENV_VAR",
    "PEER_SYNC_S",
    "AdaptiveLimiter",
    "Budget",
    "LimitsInfo",
    "LocalRequestLimiter",
    "Pacer",
    "PeerSync",
    "PrefectRequestLimiter",
    "RequestLimiter",
    "budget_for",
    "budgets_path",
    "ensure_limits",
    "limit_name",
    "load_budgets",
    "peer_sync",
    "prefect_limiter",
    "rate_limit_batch",
    "rate_limit_name",
    "read_rate_limit",
    "shared_adaptive_limiter",
]
