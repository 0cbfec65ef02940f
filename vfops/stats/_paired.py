"""Paired tests of two runs of one environment, aligned on example_id.

Both runs answer the same examples, so the comparison is paired: the unit of
resampling is the example, never the rollout (rollouts of one example are not
independent draws of the run's quality).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, TypeVar

import numpy as np
from numpy.typing import NDArray

from vfops._errors import InvalidArgumentError, VfopsError

K = TypeVar("K", bound=Hashable)

Direction = Literal["regression", "improvement", "none"]

DEFAULT_PASS_THRESHOLD = 0.5
"""An example passes when the mean reward of its rollouts is >= this (at least half pass)."""

# Bootstrap draws are generated in blocks of about this many indices, so memory
# stays bounded however many examples a run has.
_BLOCK_CELLS = 2_000_000


def shared_ids(a: Mapping[K, Sequence[float]], b: Mapping[K, Sequence[float]]) -> list[K]:
    """Example ids present (with at least one rollout) in both runs, in a stable order."""
    ids = [k for k in a.keys() & b.keys() if len(a[k]) > 0 and len(b[k]) > 0]
    try:
        return sorted(ids)  # type: ignore[type-var]
    except TypeError:
        return sorted(ids, key=repr)


def example_means(rollouts: Mapping[K, Sequence[float]], ids: Sequence[K]) -> NDArray[np.float64]:
    """Mean reward of each example's rollouts, in the order of ``ids``."""
    return np.array([math.fsum(rollouts[k]) / len(rollouts[k]) for k in ids], dtype=np.float64)


def is_binary(rewards: Mapping[Any, Sequence[float]] | Iterable[float]) -> bool:
    """True when every reward is exactly 0 or 1 (pass/fail rewards).

    Accepts a mapping ``example_id -> rewards`` or a flat iterable of rewards. An
    empty input is not binary.
    """
    if isinstance(rewards, Mapping):
        values: Iterable[float] = (r for rs in rewards.values() for r in rs)
    else:
        values = rewards
    seen = False
    for value in values:
        seen = True
        if value != 0.0 and value != 1.0:
            return False
    return seen


def per_example_pass(
    rollouts: Mapping[K, Sequence[float]], *, threshold: float = DEFAULT_PASS_THRESHOLD
) -> dict[K, bool]:
    """Whether each example passes: the mean reward of its rollouts is >= ``threshold``.

    With the default 0.5 and 0/1 rewards, an example passes when at least half of
    its rollouts pass (with R = 1, when its one rollout passes).
    """
    return {k: math.fsum(rs) / len(rs) >= threshold for k, rs in rollouts.items() if len(rs) > 0}


@dataclass(frozen=True)
class PairedResult:
    """Paired bootstrap of the mean per-example reward difference (B - A)."""

    n_examples: int
    mean_a: float
    mean_b: float
    delta: float
    ci_low: float
    ci_high: float
    p_worse: float
    """One-sided p for "B is worse than A": share of bootstrap deltas >= 0 (add-one)."""
    p_better: float
    """One-sided p for "B is better than A": share of bootstrap deltas <= 0 (add-one)."""
    p_two_sided: float
    iterations: int
    alpha: float
    significant_regression: bool
    """The upper bound of the two-sided (1 - alpha) CI is below 0."""
    significant_improvement: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def paired_bootstrap(
    a: Mapping[K, Sequence[float]],
    b: Mapping[K, Sequence[float]],
    *,
    iterations: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
) -> PairedResult:
    """Bootstrap CI and p-values of mean(B) - mean(A) over the examples both runs share.

    Each example contributes the difference of its mean rewards; the bootstrap
    resamples examples (pairs) with replacement. The CI is the percentile interval;
    the p-values are the matching percentile p-values, so ``ci_high < 0`` exactly
    when the one-sided ``p_worse`` is below ``alpha / 2``.
    """
    if iterations < 1:
        raise InvalidArgumentError("iterations must be >= 1")
    if not 0.0 < alpha < 1.0:
        raise InvalidArgumentError("alpha must be in (0, 1)")
    ids = shared_ids(a, b)
    if not ids:
        raise VfopsError("the two runs share no example_id; compare runs of the same environment")
    mean_a = example_means(a, ids)
    mean_b = example_means(b, ids)
    diffs = mean_b - mean_a
    delta = float(diffs.mean())
    boot = bootstrap_means(diffs, iterations=iterations, seed=seed)
    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    p_worse = (1 + int(np.count_nonzero(boot >= 0.0))) / (iterations + 1)
    p_better = (1 + int(np.count_nonzero(boot <= 0.0))) / (iterations + 1)
    ci_low, ci_high = float(low), float(high)
    return PairedResult(
        n_examples=len(ids),
        mean_a=float(mean_a.mean()),
        mean_b=float(mean_b.mean()),
        delta=delta,
        ci_low=ci_low,
        ci_high=ci_high,
        p_worse=p_worse,
        p_better=p_better,
        p_two_sided=min(1.0, 2 * min(p_worse, p_better)),
        iterations=iterations,
        alpha=alpha,
        significant_regression=ci_high < 0.0,
        significant_improvement=ci_low > 0.0,
    )


def bootstrap_means(
    values: NDArray[np.float64], *, iterations: int, seed: int | Sequence[int]
) -> NDArray[np.float64]:
    """Means of ``iterations`` resamples (with replacement) of ``values``, vectorised."""
    n = len(values)
    rng = np.random.default_rng(seed)
    out = np.empty(iterations, dtype=np.float64)
    block = max(1, _BLOCK_CELLS // max(n, 1))
    for start in range(0, iterations, block):
        stop = min(iterations, start + block)
        idx = rng.integers(0, n, size=(stop - start, n))
        out[start:stop] = values[idx].mean(axis=1)
    return out


@dataclass(frozen=True)
class McNemarResult:
    """Exact McNemar test on per-example pass/fail of A and B.

    ``b01``: examples that fail in A and pass in B (improvements);
    ``b10``: examples that pass in A and fail in B (regressions).
    """

    n_examples: int
    b01: int
    b10: int
    pass_rate_a: float
    pass_rate_b: float
    p_value: float
    """Exact two-sided binomial p of the discordant split (b10 of b01 + b10 at p = 1/2)."""
    p_worse: float
    """Exact one-sided p for "B fails more often than A": P(X >= b10)."""
    direction: Direction
    alpha: float
    significant_regression: bool
    """b10 > b01 and the two-sided p is below alpha."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _binom_tail_le(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exactly (integer sums, one division)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return sum(math.comb(n, i) for i in range(k + 1)) / (1 << n)


def _binom_tail_ge(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), exactly."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return sum(math.comb(n, i) for i in range(k, n + 1)) / (1 << n)


def mcnemar_exact_p(b01: int, b10: int) -> float:
    """Exact two-sided McNemar p: ``min(1, 2 * P(X <= min(b01, b10)))``, X ~ Bin(b01+b10, 1/2)."""
    n = b01 + b10
    if n == 0:
        return 1.0
    return min(1.0, 2.0 * _binom_tail_le(min(b01, b10), n))


def mcnemar(
    a_pass: Mapping[K, bool] | Sequence[bool],
    b_pass: Mapping[K, bool] | Sequence[bool],
    *,
    alpha: float = 0.05,
) -> McNemarResult:
    """Exact McNemar test of per-example pass/fail in run A versus run B.

    Mappings are aligned on their shared keys; sequences must be aligned already
    (same length, same order).
    """
    if isinstance(a_pass, Mapping) and isinstance(b_pass, Mapping):
        ids = [k for k in a_pass if k in b_pass]
        pairs = [(bool(a_pass[k]), bool(b_pass[k])) for k in ids]
    elif isinstance(a_pass, Mapping) or isinstance(b_pass, Mapping):
        raise TypeError("pass both runs as mappings or both as aligned sequences")
    else:
        if len(a_pass) != len(b_pass):
            raise InvalidArgumentError("aligned pass sequences must have the same length")
        pairs = [(bool(x), bool(y)) for x, y in zip(a_pass, b_pass, strict=True)]
    if not pairs:
        raise VfopsError("the two runs share no example_id; compare runs of the same environment")
    b01 = sum(1 for x, y in pairs if not x and y)
    b10 = sum(1 for x, y in pairs if x and not y)
    n = b01 + b10
    p = mcnemar_exact_p(b01, b10)
    direction: Direction = "regression" if b10 > b01 else "improvement" if b01 > b10 else "none"
    return McNemarResult(
        n_examples=len(pairs),
        b01=b01,
        b10=b10,
        pass_rate_a=sum(x for x, _ in pairs) / len(pairs),
        pass_rate_b=sum(y for _, y in pairs) / len(pairs),
        p_value=p,
        p_worse=_binom_tail_ge(b10, n),
        direction=direction,
        alpha=alpha,
        significant_regression=direction == "regression" and p < alpha,
    )
