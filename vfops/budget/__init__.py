"""The model-call budget shared by everything: one rate/concurrency budget per endpoint.

A budget is configured once (``budgets.toml``, :func:`budget_for`) and enforced by a
limiter attached to a client (``OpenAIClient(..., limiter=...)``):
:class:`LocalRequestLimiter` for one process; :class:`AdaptiveLimiter` learns an
endpoint's concurrency limit from its 429s when none is configured, and
:class:`PeerSync` shares what it learns with every process using the endpoint, through
the registry, where :class:`RegistryLedger` keeps spending caps too. Shared across
workers, a budget is a pair of Prefect global concurrency limits: that limiter
(``PrefectRequestLimiter``) lives with the rest of Prefect, in :mod:`vfops.orchestration`.
Importing this package imports neither Prefect nor pydantic (the exports load on first
use).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vfops.budget._adaptive import AdaptiveLimiter, shared_adaptive_limiter
    from vfops.budget._config import (
        BUDGETS_ENV_VAR,
        Budget,
        budget_for,
        budgets_path,
        check_budget_values,
        limit_name,
        load_budgets,
        rate_limit_batch,
        rate_limit_name,
    )
    from vfops.budget._ledger import RegistryLedger
    from vfops.budget._limiter import LocalRequestLimiter, LoopLocalLock, Pacer
    from vfops.budget._peer import PEER_SYNC_S, PeerSync, PeerSyncMiddleware, peer_sync
    from vfops.clients import RequestLimiter

_MODULES = {
    "vfops.budget._adaptive": ("AdaptiveLimiter", "shared_adaptive_limiter"),
    "vfops.budget._config": (
        "BUDGETS_ENV_VAR",
        "Budget",
        "budget_for",
        "budgets_path",
        "check_budget_values",
        "limit_name",
        "load_budgets",
        "rate_limit_batch",
        "rate_limit_name",
    ),
    "vfops.budget._ledger": ("RegistryLedger",),
    "vfops.budget._limiter": ("LocalRequestLimiter", "LoopLocalLock", "Pacer"),
    "vfops.budget._peer": ("PEER_SYNC_S", "PeerSync", "PeerSyncMiddleware", "peer_sync"),
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
    "LocalRequestLimiter",
    "LoopLocalLock",
    "Pacer",
    "PeerSync",
    "PeerSyncMiddleware",
    "RegistryLedger",
    "RequestLimiter",
    "budget_for",
    "budgets_path",
    "check_budget_values",
    "limit_name",
    "load_budgets",
    "peer_sync",
    "rate_limit_batch",
    "rate_limit_name",
    "shared_adaptive_limiter",
]
