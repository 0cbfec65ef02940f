"""The nightly regression check: a paired test plus the measured noise floor."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal, TypeVar

from vfops._errors import VfopsError
from vfops.stats._noise import NoiseFloor, noise_floor
from vfops.stats._paired import (
    DEFAULT_PASS_THRESHOLD,
    McNemarResult,
    PairedResult,
    is_binary,
    mcnemar,
    paired_bootstrap,
    per_example_pass,
    shared_ids,
)

K = TypeVar("K", bound=Hashable)

DETECTION_POWER = 0.8
"""The power ``min_detectable_effect`` is quoted at."""

Verdict = Literal["regression", "improvement", "within noise", "below min effect", "no change"]


@dataclass(frozen=True)
class RegressionReport:
    """Candidate B against baseline A: tests, effect, noise floor and the verdict.

    ``regressed`` is True when the drop is statistically significant (the paired
    bootstrap's CI lies below 0, or for pass/fail rewards the exact McNemar test
    finds more A-pass/B-fail than A-fail/B-pass examples at ``alpha``), AND |Δ|
    exceeds the measured noise floor, AND |Δ| exceeds ``min_effect`` when given.
    """

    tests: list[str]
    n_examples: int
    only_in_a: int
    only_in_b: int
    mean_a: float
    mean_b: float
    delta: float
    ci_low: float
    ci_high: float
    p_value: float
    """Two-sided paired-bootstrap p."""
    p_worse: float
    """One-sided paired-bootstrap p for "B is worse than A"."""
    alpha: float
    min_effect: float | None
    pass_threshold: float | None
    bootstrap: PairedResult
    mcnemar: McNemarResult | None
    noise_floor: NoiseFloor
    significant: bool
    """A significant drop (bootstrap or McNemar), before the noise-floor gate."""
    min_detectable_effect: float | None
    """The true drop this check flags with probability :data:`DETECTION_POWER` (80 %),
    from the noise measured on the baseline: the flagging threshold (the larger of the
    noise floor, ``min_effect`` and the significance bound z(1-alpha/2) x SE) plus
    z(0.8) x SE, SE being the noise-only standard deviation of the delta. Simulated
    (tests/test_stats.py, 200 examples x 4 rollouts, 200 seeded pairs per condition,
    alpha 0.05): no change flagged 1.5 %; a drop at the noise floor (0.045) 44 %; a
    drop of this size (0.065) 82 %. None when the baseline has no variance
    (``noise_floor.no_variance``): with no spread measured, no power can be quoted."""
    regressed: bool
    verdict: Verdict
    summary: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable (plain str, int, float, bool, None, list, dict)."""
        return {
            "tests": list(self.tests),
            "n_examples": self.n_examples,
            "only_in_a": self.only_in_a,
            "only_in_b": self.only_in_b,
            "mean_a": self.mean_a,
            "mean_b": self.mean_b,
            "delta": self.delta,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "p_value": self.p_value,
            "p_worse": self.p_worse,
            "alpha": self.alpha,
            "min_effect": self.min_effect,
            "pass_threshold": self.pass_threshold,
            "bootstrap": self.bootstrap.to_dict(),
            "mcnemar": self.mcnemar.to_dict() if self.mcnemar is not None else None,
            "noise_floor": self.noise_floor.to_dict(),
            "significant": self.significant,
            "min_detectable_effect": self.min_detectable_effect,
            "regressed": self.regressed,
            "verdict": self.verdict,
            "summary": self.summary,
        }


def format_p(p: float) -> str:
    """``p=0.0003``, ``p=0.012``, ``p=0.34``, ``p<0.0001`` (never ``p=0.0``)."""
    if p < 1e-4:
        return "p<0.0001"
    if p < 0.1:
        return f"p={p:.2g}"
    return f"p={p:.2f}"


def compare_runs_statistically(
    a: Mapping[K, Sequence[float]],
    b: Mapping[K, Sequence[float]],
    *,
    pass_threshold: float | None = None,
    alpha: float = 0.05,
    min_effect: float | None = None,
    seed: int = 0,
    iterations: int = 10_000,
    noise_iterations: int = 2_000,
) -> RegressionReport:
    """Compare candidate run ``b`` against baseline run ``a`` (``example_id -> rewards``).

    Only example ids present in both runs are compared. The paired bootstrap always
    runs; the exact McNemar test also runs when every reward of both runs is 0/1
    (an example passes when at least half its rollouts pass) or when
    ``pass_threshold`` is given (an example passes when its mean reward reaches it).
    The noise floor is measured from the baseline run (see :func:`noise_floor`).
    """
    ids = shared_ids(a, b)
    if not ids:
        raise VfopsError("the two runs share no example_id; compare runs of the same environment")
    a_shared = {k: a[k] for k in ids}
    b_shared = {k: b[k] for k in ids}
    boot = paired_bootstrap(a_shared, b_shared, iterations=iterations, seed=seed, alpha=alpha)
    tests = ["paired bootstrap"]
    threshold = pass_threshold
    if threshold is None and is_binary(a_shared) and is_binary(b_shared):
        threshold = DEFAULT_PASS_THRESHOLD
    mc: McNemarResult | None = None
    if threshold is not None:
        mc = mcnemar(
            per_example_pass(a_shared, threshold=threshold),
            per_example_pass(b_shared, threshold=threshold),
            alpha=alpha,
        )
        tests.append("McNemar exact")
    floor = noise_floor(a_shared, iterations=noise_iterations, seed=seed)

    delta = boot.delta
    mde = (
        None
        if floor.no_variance
        else min_detectable_effect(floor, alpha=alpha, min_effect=min_effect)
    )
    significant = boot.significant_regression or (mc is not None and mc.significant_regression)
    improved = boot.significant_improvement or (
        mc is not None and mc.direction == "improvement" and mc.p_value < alpha
    )
    above_floor = abs(delta) > floor.value
    above_min = min_effect is None or abs(delta) > min_effect
    regressed = significant and delta < 0 and above_floor and above_min
    verdict: Verdict
    if regressed:
        verdict = "regression"
    elif (significant and delta < 0) or (improved and delta > 0):
        if not above_floor:
            verdict = "within noise"
        elif not above_min:
            verdict = "below min effect"
        else:
            verdict = "improvement"
    else:
        verdict = "no change"

    stats = (
        f"Δ {delta:+.3f}, {(1 - alpha) * 100:g}% CI [{boot.ci_low:+.3f}, {boot.ci_high:+.3f}], "
        f"{format_p(boot.p_two_sided)}"
    )
    if mc is not None:
        stats += f", McNemar {format_p(mc.p_value)} ({mc.b10} pass→fail, {mc.b01} fail→pass)"
    summary = (
        f"reward {boot.mean_a:.3f} -> {boot.mean_b:.3f} ({stats}); {floor.describe()}"
        f"{f'; min effect {min_effect:.3f}' if min_effect is not None else ''}"
        f"; {_detection(mde)}: {verdict.upper()}"
    )
    return RegressionReport(
        tests=tests,
        n_examples=len(ids),
        only_in_a=len(a.keys() - b.keys()),
        only_in_b=len(b.keys() - a.keys()),
        mean_a=boot.mean_a,
        mean_b=boot.mean_b,
        delta=delta,
        ci_low=boot.ci_low,
        ci_high=boot.ci_high,
        p_value=boot.p_two_sided,
        p_worse=boot.p_worse,
        alpha=alpha,
        min_effect=min_effect,
        pass_threshold=threshold,
        bootstrap=boot,
        mcnemar=mc,
        noise_floor=floor,
        significant=significant,
        min_detectable_effect=mde,
        regressed=regressed,
        verdict=verdict,
        summary=summary,
    )


def _detection(mde: float | None) -> str:
    if mde is None:  # a spread of zero says nothing of how a candidate's drop would spread
        return "power not estimable"
    return f"detects drops ≥ {mde:.3f} with {DETECTION_POWER:.0%} power"


def min_detectable_effect(
    floor: NoiseFloor,
    *,
    alpha: float = 0.05,
    min_effect: float | None = None,
    power: float = DETECTION_POWER,
) -> float:
    """The true drop flagged with probability ``power`` (normal approximation).

    A drop is flagged when the observed delta passes a threshold: the noise floor,
    ``min_effect``, and the paired test's own bound z(1 - alpha/2) x SE, whichever is
    largest. The observed delta of a true drop d is about Normal(-d, SE), SE being the
    noise-only spread of the delta measured on the baseline, so it passes with
    probability ``power`` once d = threshold + z(power) x SE.
    """
    normal = NormalDist()
    se = floor.se
    threshold = max(floor.value, min_effect or 0.0, normal.inv_cdf(1 - alpha / 2) * se)
    return threshold + normal.inv_cdf(power) * se
