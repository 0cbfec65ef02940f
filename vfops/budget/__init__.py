"""The model-call budget shared by everything: one rate/concurrency budget per endpoint.

Budgets are Prefect global concurrency limits (:func:`ensure_limits`,
:class:`PrefectRequestLimiter`), so sweeps, judge scoring and training rollouts on
any worker cannot exceed an API's limit together; :class:`LocalRequestLimiter`
is the same for one process without Prefect. A limiter is attached to a client
with ``OpenAIClient(..., limiter=...)``. Importing this package does not import
Prefect.
"""

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
from vfops.budget._prefect import (
    LimitsInfo,
    PrefectRequestLimiter,
    ensure_limits,
    prefect_limiter,
    read_rate_limit,
)
from vfops.clients._openai import RequestLimiter

__all__ = [
    "BUDGETS_ENV_VAR",
    "Budget",
    "LimitsInfo",
    "LocalRequestLimiter",
    "Pacer",
    "PrefectRequestLimiter",
    "RequestLimiter",
    "budget_for",
    "budgets_path",
    "ensure_limits",
    "limit_name",
    "load_budgets",
    "prefect_limiter",
    "rate_limit_batch",
    "rate_limit_name",
    "read_rate_limit",
]
