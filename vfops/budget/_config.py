"""Budget names and per-endpoint budgets (``budgets.toml``); no Prefect here.

``budgets.toml``::

    [budget.small]              # an endpoint alias (or a judge model name)
    max_concurrent = 8          # requests in flight at once, across every worker
    requests_per_s = 5          # requests started per second, across every worker

The file is the one given, else ``$VFOPS_BUDGETS``, else ``./budgets.toml`` when it
exists. Values passed as arguments override the file's.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from vfops._config import ConfigModel, describe_errors, load_toml
from vfops._errors import InvalidArgumentError, VfopsError

BUDGETS_ENV_VAR = "VFOPS_BUDGETS"
DEFAULT_BUDGETS_FILE = "budgets.toml"
LIMIT_PREFIX = "vfops"
RATE_SUFFIX = "-rate"

LimitKind = Literal["endpoint", "judge"]

_UNSAFE = re.compile(r"[^a-z0-9._-]+")


def limit_name(kind: LimitKind, alias: str) -> str:
    """The global-limit name of an endpoint alias or a judge model.

    ``limit_name("endpoint", "small")`` -> ``"vfops-endpoint-small"``;
    ``limit_name("judge", "openai/GPT-4.1")`` -> ``"vfops-judge-openai-gpt-4.1"``
    (lower case; anything but letters, digits, ``.``, ``_``, ``-`` becomes ``-``).
    The rate limit of a budget is this name plus ``"-rate"`` (:func:`rate_limit_name`).
    """
    if kind not in ("endpoint", "judge"):
        raise InvalidArgumentError(f"kind must be 'endpoint' or 'judge', got {kind!r}")
    cleaned = _UNSAFE.sub("-", alias.strip().lower()).strip("-")
    if not cleaned:
        raise VfopsError(f"cannot name a budget after {alias!r}: it has no letters or digits")
    return f"{LIMIT_PREFIX}-{kind}-{cleaned}"


def rate_limit_name(name: str) -> str:
    """The name of the rate limit (a decaying global limit) of budget ``name``."""
    return name + RATE_SUFFIX


def rate_limit_batch(requests_per_s: float) -> int:
    """Slots a worker takes from the shared rate limit at a time: about one
    second's worth (at least 1). This is also the rate limit's ``limit`` (its
    burst): Prefect decays slots in whole units, so taking one slot per request
    loses most of the rate to rounding (measured: ~40 % of R achieved)."""
    return max(1, math.ceil(requests_per_s - 1e-9))


class BudgetLimits(ConfigModel):
    """The limits of one budget; ``[budget.<alias>]`` in ``budgets.toml``."""

    max_concurrent: int | None = Field(
        default=None, ge=1, description="Requests in flight at once, across every worker."
    )
    requests_per_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Requests started per second, across every worker.",
    )


class BudgetsFile(ConfigModel):
    """``budgets.toml``: one ``[budget.<alias>]`` table per endpoint alias or judge model."""

    budget: dict[str, BudgetLimits] = Field(
        default_factory=dict, description="Budgets by endpoint alias (or judge model name)."
    )


@dataclass(frozen=True, slots=True)
class Budget:
    """The shared model-call budget of one endpoint alias (``None``: no limit)."""

    alias: str
    max_concurrent: int | None = None
    requests_per_s: float | None = None

    def __post_init__(self) -> None:
        check_budget_values(
            self.max_concurrent, self.requests_per_s, where=f"budget {self.alias!r}"
        )

    @property
    def unlimited(self) -> bool:
        return self.max_concurrent is None and self.requests_per_s is None


def check_budget_values(
    max_concurrent: int | None, requests_per_s: float | None, *, where: str
) -> None:
    """Raise :class:`VfopsError` unless both are ``None`` or positive (the rules of
    :class:`BudgetLimits`, the file's)."""
    try:
        BudgetLimits(max_concurrent=max_concurrent, requests_per_s=requests_per_s)
    except ValidationError as exc:
        raise VfopsError(f"{where}: " + "; ".join(describe_errors(exc, BudgetLimits))) from None


def budgets_path(path: str | os.PathLike[str] | None = None) -> Path | None:
    """The budgets file to read: ``path``, ``$VFOPS_BUDGETS``, or ``./budgets.toml``
    when it exists (``None`` when there is none)."""
    if path is not None:
        return Path(path).expanduser()
    env = os.environ.get(BUDGETS_ENV_VAR)
    if env:
        return Path(env).expanduser()
    default = Path(DEFAULT_BUDGETS_FILE)
    return default if default.is_file() else None


def load_budgets(path: str | os.PathLike[str]) -> dict[str, Budget]:
    """Parse a budgets file into ``{alias: Budget}``; a :class:`ConfigError` (one line per
    problem, each naming the file and ``[budget.<alias>].field``) when it is bad."""
    file = load_toml(os.fspath(path), BudgetsFile)
    return {
        alias: Budget(alias, limits.max_concurrent, limits.requests_per_s)
        for alias, limits in file.budget.items()
    }


def budget_for(
    alias: str,
    *,
    budgets_file: str | os.PathLike[str] | None = None,
    max_concurrent: int | None = None,
    requests_per_s: float | None = None,
) -> Budget:
    """The budget of ``alias``: the budgets file's ``[budget.<alias>]`` (see
    :func:`budgets_path`), with ``max_concurrent`` / ``requests_per_s`` overriding it."""
    check_budget_values(max_concurrent, requests_per_s, where=f"budget {alias!r}")
    file = budgets_path(budgets_file)
    base = load_budgets(file).get(alias) if file is not None else None
    if base is None:
        base = Budget(alias=alias)
    return Budget(
        alias=alias,
        max_concurrent=base.max_concurrent if max_concurrent is None else max_concurrent,
        requests_per_s=base.requests_per_s if requests_per_s is None else float(requests_per_s),
    )
