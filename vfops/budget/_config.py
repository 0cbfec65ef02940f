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
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vfops._errors import VfopsError

BUDGETS_ENV_VAR = "VFOPS_BUDGETS"
DEFAULT_BUDGETS_FILE = "budgets.toml"
LIMIT_PREFIX = "vfops"
RATE_SUFFIX = "-rate"

LimitKind = Literal["endpoint", "judge"]

_UNSAFE = re.compile(r"[^a-z0-9._-]+")
_FIELDS = ("max_concurrent", "requests_per_s")


def limit_name(kind: LimitKind, alias: str) -> str:
    """The global-limit name of an endpoint alias or a judge model.

    ``limit_name("endpoint", "small")`` -> ``"vfops-endpoint-small"``;
    ``limit_name("judge", "openai/GPT-4.1")`` -> ``"vfops-judge-openai-gpt-4.1"``
    (lower case; anything but letters, digits, ``.``, ``_``, ``-`` becomes ``-``).
    The rate limit of a budget is this name plus ``"-rate"`` (:func:`rate_limit_name`).
    """
    if kind not in ("endpoint", "judge"):
        raise ValueError(f"kind must be 'endpoint' or 'judge', got {kind!r}")
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
    """Raise :class:`VfopsError` unless both are ``None`` or positive."""
    if max_concurrent is not None and (
        isinstance(max_concurrent, bool)
        or not isinstance(max_concurrent, int)
        or max_concurrent < 1
    ):
        raise VfopsError(
            f"{where}: max_concurrent must be a whole number >= 1, got {max_concurrent!r}"
        )
    if requests_per_s is not None and (
        isinstance(requests_per_s, bool)
        or not isinstance(requests_per_s, int | float)
        or not math.isfinite(requests_per_s)
        or requests_per_s <= 0
    ):
        raise VfopsError(f"{where}: requests_per_s must be a number > 0, got {requests_per_s!r}")


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
    """Parse a budgets file into ``{alias: Budget}``; one-line :class:`VfopsError` on errors."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise VfopsError(
            f"budgets file {file} not found; create it or pass the right path"
        ) from None
    except OSError as exc:
        raise VfopsError(f"cannot read budgets file {file}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise VfopsError(f"{file}: invalid TOML ({exc}); fix the syntax") from None
    unknown = sorted(set(data) - {"budget"})
    if unknown:
        raise VfopsError(
            f"{file}: unknown top-level key {unknown[0]!r}; "
            "write budgets as [budget.<alias>] tables"
        )
    tables = data.get("budget", {})
    if not isinstance(tables, dict):
        raise VfopsError(f"{file}: 'budget' must be a table; write [budget.<alias>]")
    budgets: dict[str, Budget] = {}
    for alias, table in tables.items():
        where = f"{file}: [budget.{alias}]"
        if not isinstance(table, dict):
            raise VfopsError(f"{where} must be a table with max_concurrent and/or requests_per_s")
        extra = sorted(set(table) - set(_FIELDS))
        if extra:
            raise VfopsError(
                f"{where} has unknown field {extra[0]!r}; allowed: max_concurrent, requests_per_s"
            )
        max_concurrent = table.get("max_concurrent")
        requests_per_s = table.get("requests_per_s")
        check_budget_values(max_concurrent, requests_per_s, where=where)
        budgets[alias] = Budget(
            alias=alias,
            max_concurrent=max_concurrent,
            requests_per_s=None if requests_per_s is None else float(requests_per_s),
        )
    return budgets


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
