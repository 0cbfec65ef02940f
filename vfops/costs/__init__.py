"""What model calls cost, and spending caps that hold across processes.

Prices come from ``endpoints.toml`` (USD per million tokens); every rollout records
its cost (``None``: unpriced). A capped evaluation reserves each request's
worst-case cost in the registry's ledger before sending it, and stops with status
``budget_exhausted`` when a cap has no room. Importing this package is cheap, and it
sits below the registry: the registry's ledger itself is
:class:`vfops.budget.RegistryLedger`.
"""

from vfops.costs._ledger import (
    BUDGET_EXHAUSTED_EXIT_CODE,
    BudgetExhausted,
    CostLedger,
    charge_rollout,
    current_ledger,
    scoring_rollout,
    use_ledger,
)
from vfops.costs._pricing import (
    CAP_TOLERANCE_USD,
    DEFAULT_MAX_COMPLETION_TOKENS,
    Pricing,
    format_cost,
    max_completion_tokens,
    prompt_tokens_bound,
    requested_completion_tokens,
)

__all__ = [
    "BUDGET_EXHAUSTED_EXIT_CODE",
    "CAP_TOLERANCE_USD",
    "DEFAULT_MAX_COMPLETION_TOKENS",
    "BudgetExhausted",
    "CostLedger",
    "Pricing",
    "charge_rollout",
    "current_ledger",
    "format_cost",
    "max_completion_tokens",
    "prompt_tokens_bound",
    "requested_completion_tokens",
    "scoring_rollout",
    "use_ledger",
]
