"""The noise floor of a run comparison, measured from the baseline run itself.

Two runs of the same model on the same examples still differ, because each
rollout is a fresh sample. The noise floor is the size of mean-reward difference
that this sampling noise alone produces 95 % of the time; a change smaller than
it is not reported as a regression however small its p-value.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, TypeVar

import numpy as np
from numpy.typing import NDArray

from vfops._errors import InvalidArgumentError, VfopsError
from vfops.stats._paired import _BLOCK_CELLS, bootstrap_means

K = TypeVar("K", bound=Hashable)

NoiseMethod = Literal["split-half", "bootstrap-se"]


@dataclass(frozen=True)
class NoiseFloor:
    """The |delta| that sampling noise alone stays under with probability ``quantile``."""

    value: float
    method: NoiseMethod
    quantile: float
    se: float
    """Standard deviation of the noise-only delta distribution."""
    n_examples: int
    """Examples the estimate used."""
    n_excluded: int
    """Examples left out (split-half: those with a single rollout)."""
    min_rollouts: int
    max_rollouts: int
    iterations: int

    @property
    def no_variance(self) -> bool:
        """The baseline did not vary where the floor is measured: every rollout of an
        example scored alike (split-half), or every example did (one rollout each).
        There is then no noise to measure, and no spread to quote a power from."""
        return self.se == 0.0 and self.value == 0.0

    def describe(self) -> str:
        """One sentence fragment: ``noise floor ±0.04 measured by ...``."""
        pct = f"{self.quantile * 100:g}th percentile"
        rollouts = (
            f"{self.min_rollouts}"
            if self.min_rollouts == self.max_rollouts
            else f"{self.min_rollouts}-{self.max_rollouts}"
        )
        if self.no_variance and self.method == "split-half":
            return (
                f"no sampling noise in the baseline (the {rollouts} rollouts of each of its "
                f"{self.n_examples} examples scored alike): no noise floor to measure"
            )
        if self.no_variance:
            return (
                f"the baseline has no variance (its {self.n_examples} examples, one rollout "
                "each, scored alike): no noise floor to measure"
            )
        if self.method == "split-half":
            text = (
                f"noise floor ±{self.value:.3f} measured by split-half resampling of the "
                f"baseline ({pct} of |Δ|, {self.n_examples} examples x {rollouts} rollouts"
            )
            if self.n_excluded:
                text += f", {self.n_excluded} single-rollout examples excluded"
            return text + ")"
        return (
            f"noise floor ±{self.value:.3f} estimated from the bootstrap SE of the baseline mean "
            f"({pct}, x√2 for two runs; 1 rollout per example, so an upper bound)"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def noise_floor(
    a_rollouts: Mapping[K, Sequence[float]],
    *,
    iterations: int = 2_000,
    seed: int = 0,
    quantile: float = 0.95,
) -> NoiseFloor:
    """Measure the noise floor of comparisons against the baseline run ``a_rollouts``.

    With R >= 2 rollouts per example (split-half): each iteration splits every
    example's rollouts into two random halves and takes the mean over examples of
    (mean of half 1 - mean of half 2). That difference has the same expectation as
    a rerun (zero) and comes from sampling noise only; its distribution over the
    iterations, rescaled from half-size to full-size samples (see below), is the
    distribution of the delta two full runs would show with no real change. The
    floor is its ``quantile`` of |delta|.

    With one rollout per example there is nothing to split: the floor falls back to
    the bootstrap standard error of the baseline's mean reward (resampling
    examples), times √2 for the difference of two runs. That also counts the
    spread between examples as noise, so it is an upper bound.
    """
    if iterations < 1:
        raise InvalidArgumentError("iterations must be >= 1")
    if not 0.0 < quantile < 1.0:
        raise InvalidArgumentError("quantile must be in (0, 1)")
    rollouts = {k: list(v) for k, v in a_rollouts.items() if len(v) > 0}
    if not rollouts:
        raise VfopsError("the baseline run has no rollouts; cannot measure its noise floor")
    lengths = [len(v) for v in rollouts.values()]
    splittable = {k: v for k, v in rollouts.items() if len(v) >= 2}
    if len(splittable) >= 2:
        deltas = _split_half_deltas(splittable, iterations=iterations, seed=seed)
        method: NoiseMethod = "split-half"
        used = list(splittable.values())
    else:
        means = np.array([math.fsum(v) / len(v) for v in rollouts.values()], dtype=np.float64)
        boot = bootstrap_means(means, iterations=iterations, seed=[seed, 1])
        # SE of one run's mean; the difference of two independent runs has √2 x that.
        deltas = (boot - means.mean()) * math.sqrt(2.0)
        method = "bootstrap-se"
        used = list(rollouts.values())
    return NoiseFloor(
        value=float(np.quantile(np.abs(deltas), quantile)),
        method=method,
        quantile=quantile,
        se=float(deltas.std()),
        n_examples=len(used),
        n_excluded=len(rollouts) - len(used),
        min_rollouts=min(len(v) for v in used) if method == "split-half" else min(lengths),
        max_rollouts=max(len(v) for v in used) if method == "split-half" else max(lengths),
        iterations=iterations,
    )


def _split_half_deltas(
    rollouts: Mapping[K, list[float]], *, iterations: int, seed: int
) -> NDArray[np.float64]:
    """Noise-only deltas (scaled to full-size runs) from random split halves, vectorised.

    Scaling: for an example whose rollouts have per-rollout variance s², the mean of
    h rollouts has variance s²/h, so the difference of two random halves of sizes
    h1 + h2 = R has variance s²(1/h1 + 1/h2) (for a random split of the R observed
    rollouts this holds exactly with s² the unbiased sample variance). Two full
    runs of R rollouts each would differ by variance s²(2/R). Multiplying each
    example's half-difference by sqrt((2/R) / (1/h1 + 1/h2)) turns the first into
    the second; for even R that is 1/√2 (halves of R/2 are twice as noisy as a
    full run's difference). Examples may have different R: each gets its own factor.
    """
    rng = np.random.default_rng([seed, 2])
    by_length: dict[int, list[list[float]]] = defaultdict(list)
    for values in rollouts.values():
        by_length[len(values)].append(values)
    total = np.zeros(iterations, dtype=np.float64)
    for r, rows in sorted(by_length.items()):
        x = np.array(rows, dtype=np.float64)  # (n, R)
        n = x.shape[0]
        h1 = r // 2
        h2 = r - h1
        scale = math.sqrt((2.0 / r) / (1.0 / h1 + 1.0 / h2))
        row_sums = x.sum(axis=1)
        block = max(1, _BLOCK_CELLS // (n * r))
        for start in range(0, iterations, block):
            stop = min(iterations, start + block)
            # A random permutation of each example's rollouts; the first h1 are half 1.
            perm = np.argsort(rng.random((stop - start, n, r)), axis=2)[:, :, :h1]
            s1 = np.take_along_axis(np.broadcast_to(x, (stop - start, n, r)), perm, axis=2).sum(
                axis=2
            )
            diff = (s1 / h1 - (row_sums - s1) / h2) * scale  # (iterations, n)
            total[start:stop] += diff.sum(axis=1)
    result: NDArray[np.float64] = total / len(rollouts)
    return result
