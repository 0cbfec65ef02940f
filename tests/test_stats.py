"""vfops.stats: paired bootstrap, exact McNemar, measured noise floor, regression verdict."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vfops._errors import VfopsError
from vfops.stats import (
    compare_runs_statistically,
    format_p,
    is_binary,
    mcnemar,
    mcnemar_exact_p,
    noise_floor,
    paired_bootstrap,
    per_example_pass,
)

Runs = dict[int, list[float]]


def bernoulli_run(rng: np.random.Generator, probs: np.ndarray, rollouts: int) -> Runs:
    draws = rng.random((len(probs), rollouts)) < probs[:, None]
    return {i: [float(x) for x in row] for i, row in enumerate(draws)}


def planted_drop(seed: int = 0) -> tuple[Runs, Runs]:
    """200 examples x 4 rollouts at p=0.7; the candidate forces 40 examples to 0."""
    rng = np.random.default_rng(seed)
    a = bernoulli_run(rng, np.full(200, 0.7), 4)
    dropped = set(rng.choice(200, size=40, replace=False).tolist())
    b = {k: ([0.0] * len(v) if k in dropped else list(v)) for k, v in a.items()}
    return a, b


def test_planted_drop_is_flagged_by_bootstrap_and_mcnemar() -> None:
    a, b = planted_drop()
    report = compare_runs_statistically(a, b, seed=1)
    assert report.regressed
    assert report.verdict == "regression"
    assert report.tests == ["paired bootstrap", "McNemar exact"]
    assert report.bootstrap.significant_regression
    assert report.ci_high < 0
    assert report.mcnemar is not None
    assert report.mcnemar.significant_regression
    assert report.mcnemar.direction == "regression"
    assert report.mcnemar.b01 == 0 and report.mcnemar.b10 > 20
    assert report.delta < -report.noise_floor.value
    assert report.noise_floor.method == "split-half"
    assert "noise floor ±" in report.summary and "split-half" in report.summary
    assert report.summary.endswith("REGRESSION")
    # JSON-serialisable, no numpy scalars anywhere.
    assert json.loads(json.dumps(report.to_dict()))["regressed"] is True


def test_sampling_noise_alone_is_not_flagged_across_seeds() -> None:
    false_positives = 0
    for seed in range(20):
        rng = np.random.default_rng(1000 + seed)
        probs = rng.uniform(0.0, 1.0, 200)  # same per-example success probabilities
        a = bernoulli_run(rng, probs, 4)
        b = bernoulli_run(rng, probs, 4)  # independent draws
        report = compare_runs_statistically(a, b, seed=seed, iterations=4_000)
        false_positives += report.regressed
    assert false_positives <= 2, f"{false_positives} of 20 noise-only comparisons flagged"


def test_continuous_rewards_planted_drop_detected_and_noise_not() -> None:
    rng = np.random.default_rng(7)
    level = rng.uniform(0.3, 0.9, 150)

    def run(shift: np.ndarray) -> Runs:
        noise = rng.uniform(-0.2, 0.2, (150, 3))
        values = np.clip(level[:, None] + noise - shift[:, None], 0.0, 1.0)
        return {i: [float(x) for x in row] for i, row in enumerate(values)}

    a = run(np.zeros(150))
    shift = np.zeros(150)
    shift[:50] = 0.3
    b = run(shift)
    report = compare_runs_statistically(a, b)
    assert not is_binary(a)
    assert report.mcnemar is None and report.tests == ["paired bootstrap"]
    assert report.regressed
    assert report.delta == pytest.approx(-0.1, abs=0.03)

    same = compare_runs_statistically(a, run(np.zeros(150)))
    assert not same.regressed
    # A threshold turns on McNemar for continuous rewards too.
    with_threshold = compare_runs_statistically(a, b, pass_threshold=0.5)
    assert with_threshold.mcnemar is not None
    assert with_threshold.pass_threshold == 0.5


def test_mcnemar_exact_p_matches_hand_computation() -> None:
    # 2 fail->pass, 8 pass->fail: n = 10 discordant, X ~ Bin(10, 1/2).
    # P(X <= 2) = (C(10,0) + C(10,1) + C(10,2)) / 2^10 = (1 + 10 + 45) / 1024 = 56/1024.
    # Two-sided p = 2 * 56/1024 = 0.109375; one-sided P(X >= 8) = 56/1024.
    a_pass = [True] * 8 + [False] * 2 + [True] * 5 + [False] * 5
    b_pass = [False] * 8 + [True] * 2 + [True] * 5 + [False] * 5
    result = mcnemar(a_pass, b_pass)
    assert (result.b01, result.b10) == (2, 8)
    assert result.p_value == pytest.approx(112 / 1024, rel=1e-12)
    assert result.p_worse == pytest.approx(56 / 1024, rel=1e-12)
    assert result.direction == "regression"
    assert not result.significant_regression  # 0.109 > 0.05
    assert result.pass_rate_a == pytest.approx(13 / 20)
    assert result.pass_rate_b == pytest.approx(7 / 20)

    assert mcnemar_exact_p(0, 0) == 1.0
    assert mcnemar_exact_p(5, 5) == 1.0
    assert mcnemar_exact_p(0, 6) == pytest.approx(2 / 64)
    # Large n stays exact and finite.
    assert 0.0 < mcnemar_exact_p(400, 520) < 1e-4

    # Mappings align on shared keys.
    by_id = mcnemar({1: True, 2: True, 3: False}, {2: False, 3: True, 4: True})
    assert (by_id.n_examples, by_id.b01, by_id.b10, by_id.direction) == (2, 1, 1, "none")
    with pytest.raises(ValueError):
        mcnemar([True], [True, False])


def test_noise_floor_shrinks_as_rollouts_grow() -> None:
    rng = np.random.default_rng(3)
    probs = rng.uniform(0.2, 0.9, 200)
    floors = [
        noise_floor(bernoulli_run(rng, probs, r), iterations=1_000, seed=0).value
        for r in (2, 4, 8, 16)
    ]
    assert floors == sorted(floors, reverse=True)
    # Variance of the delta is ∝ 1/R: quadrupling R roughly halves the floor.
    assert floors[3] / floors[1] == pytest.approx(0.5, abs=0.12)
    # Calibrated: ≈ 1.96 x sqrt(2 E[p(1-p)] / (n R)) for R = 4.
    expected = 1.96 * np.sqrt(2 * np.mean(probs * (1 - probs)) / (200 * 4))
    assert floors[1] == pytest.approx(expected, rel=0.2)


def test_noise_floor_single_rollout_falls_back_to_bootstrap_se() -> None:
    rng = np.random.default_rng(4)
    floor = noise_floor(bernoulli_run(rng, np.full(300, 0.5), 1), iterations=2_000)
    assert floor.method == "bootstrap-se"
    assert "bootstrap SE" in floor.describe() and "upper bound" in floor.describe()
    # sqrt(2) x 1.96 x SE of a mean of 300 fair coins.
    assert floor.value == pytest.approx(1.96 * np.sqrt(2 * 0.25 / 300), rel=0.15)
    # Mixed R: single-rollout examples are left out of the split-half estimate.
    mixed = {i: [1.0, 0.0, 1.0] for i in range(10)} | {10 + i: [1.0] for i in range(5)}
    assert noise_floor(mixed).n_excluded == 5


def test_improvement_is_not_flagged_as_regression() -> None:
    a, b = planted_drop(seed=5)
    report = compare_runs_statistically(b, a)  # the dropped run is now the baseline
    assert report.delta > 0
    assert not report.regressed and not report.significant
    assert report.verdict == "improvement"
    assert report.bootstrap.significant_improvement
    assert report.mcnemar is not None and report.mcnemar.direction == "improvement"
    assert report.summary.endswith("IMPROVEMENT")


def test_min_effect_and_noise_floor_gate_significance() -> None:
    a, b = planted_drop(seed=2)
    report = compare_runs_statistically(a, b, min_effect=0.5)
    assert report.significant and not report.regressed
    assert report.verdict == "below min effect"


def test_paired_bootstrap_uses_shared_examples_and_is_seeded() -> None:
    a = {i: [1.0, 0.0] for i in range(50)} | {"only-a": [1.0]}
    b = {i: [0.0, 0.0] if i < 10 else [1.0, 0.0] for i in range(50)} | {"only-b": [0.0]}
    first = paired_bootstrap(a, b, iterations=2_000, seed=9)
    assert first.n_examples == 50
    assert first.delta == pytest.approx(-0.1)
    assert first == paired_bootstrap(a, b, iterations=2_000, seed=9)
    assert first.ci_low <= first.delta <= first.ci_high
    assert first.p_worse < 0.01 < first.p_better
    report = compare_runs_statistically(a, b)
    assert (report.only_in_a, report.only_in_b) == (1, 1)
    with pytest.raises(VfopsError, match="share no example_id"):
        paired_bootstrap({1: [1.0]}, {2: [1.0]})


def test_is_binary_and_per_example_pass() -> None:
    assert is_binary({1: [0.0, 1.0], 2: [1.0]})
    assert is_binary([0, 1, 1.0])
    assert not is_binary({1: [0.5]})
    assert not is_binary([])
    # Default: an example passes when at least half its rollouts pass.
    assert per_example_pass({1: [1.0, 0.0], 2: [1.0, 0.0, 0.0], 3: [1.0]}) == {
        1: True,
        2: False,
        3: True,
    }
    assert per_example_pass({1: [1.0, 0.0]}, threshold=1.0) == {1: False}


def test_format_p() -> None:
    assert format_p(0.00003) == "p<0.0001"
    assert format_p(0.0003) == "p=0.0003"
    assert format_p(0.0123) == "p=0.012"
    assert format_p(0.5) == "p=0.50"


def test_detection_power_near_the_noise_floor() -> None:
    """Seeded simulation of many paired runs: false-positive rate and detection power.

    200 examples x 4 rollouts (per-example success probabilities 0.2-0.9), 200 pairs per
    condition. Measured (and recorded in RegressionReport.min_detectable_effect's
    docstring): no change flagged 1.5 %; a drop the size of the noise floor (0.045)
    44 %; a drop of the reported min_detectable_effect (0.065) 82 %.
    """
    n, rollouts, sims = 200, 4, 200
    probs = np.random.default_rng(2026).uniform(0.2, 0.9, n)

    def flagged_share(drop: float, stream: int) -> tuple[float, list[float], list[float]]:
        hits, mdes, floors = 0, [], []
        for s in range(sims):
            rng = np.random.default_rng([stream, s])
            a = bernoulli_run(rng, probs, rollouts)
            b = bernoulli_run(rng, np.clip(probs - drop, 0.0, 1.0), rollouts)
            report = compare_runs_statistically(
                a, b, seed=s, iterations=1_000, noise_iterations=500
            )
            hits += report.regressed
            mdes.append(report.min_detectable_effect)
            floors.append(report.noise_floor.value)
        return hits / sims, mdes, floors

    false_positive_rate, mdes, floors = flagged_share(0.0, 11)
    mde, floor = float(np.mean(mdes)), float(np.mean(floors))
    at_floor, _, _ = flagged_share(floor, 12)
    at_mde, _, _ = flagged_share(mde, 13)
    print(
        f"false positives {false_positive_rate:.1%}; noise floor {floor:.3f} -> power "
        f"{at_floor:.0%}; min detectable effect {mde:.3f} -> power {at_mde:.0%}"
    )
    assert false_positive_rate <= 0.05  # alpha: the noise-floor gate only lowers it
    assert 0.3 <= at_floor <= 0.65  # a drop at the floor is a coin flip
    assert 0.7 <= at_mde <= 0.9  # the quoted 80 %, within simulation error
    assert 1.2 < mde / floor < 1.6  # (1.96 + 0.84) / 1.96 ≈ 1.43


def test_a_runs_summary_and_mlflow_metrics_per_agent() -> None:
    from vfops._rollout import RolloutRecord
    from vfops.stats import EvalSummary
    from vfops.tracking._eval_runs import _metrics_from_stored

    summary = EvalSummary()
    for episode, (a, b) in enumerate([(2.0, -2.0), (1.0, -1.0)]):
        for position, (agent, reward) in enumerate([("opener", a), ("responder", b)]):
            summary.add(
                RolloutRecord(
                    example_id=0,
                    rollout_index=episode * 1000 + position,
                    prompt=[],
                    completion=[],
                    reward=reward,
                    episode=episode,
                    agent=agent,
                )
            )
    stored = summary.to_dict()
    assert stored["reward_mean"] == 0.0  # zero-sum overall: only the seats tell
    assert stored["agents"] == {
        "opener": {"rollouts": 2, "scored": 2, "reward_mean": 1.5},
        "responder": {"rollouts": 2, "scored": 2, "reward_mean": -1.5},
    }
    metrics = _metrics_from_stored(stored)
    assert metrics["agent/opener/reward_mean"] == 1.5
    assert metrics["agent/responder/reward_mean"] == -1.5


def test_a_run_with_nothing_scored_has_no_reward_and_errors_are_no_attempts() -> None:
    """Every rollout an error: the stored summary's reward is None (the registry's
    ``runs list`` shows "-"), never a 0.0 that reads as a score; pass@k counts only
    scored rollouts, so an error is not a failed attempt."""
    from vfops._rollout import RolloutError, RolloutRecord
    from vfops.stats import EvalSummary
    from vfops.tracking._eval_runs import _metrics_from_stored

    def record(example: int, index: int, reward: float | None) -> RolloutRecord:
        error = (
            None
            if reward is not None
            else RolloutError(type="ProviderError", message="400", stage="generation")
        )
        return RolloutRecord(example_id=example, rollout_index=index, prompt=[], completion=[],
                             reward=reward, error=error)  # fmt: skip

    failed = EvalSummary()
    for index in range(4):
        failed.add(record(0, index, None))
    stored = failed.to_dict()
    assert (stored["scored"], stored["errors"]) == (0, 4)
    assert stored["reward_mean"] is stored["reward_std"] is stored["reward_stderr"] is None
    assert stored["pass_at_k"] == {}
    metrics = _metrics_from_stored(stored)
    assert "reward_mean" not in metrics and not any(k.startswith("pass_at") for k in metrics)

    mixed = EvalSummary()  # example 0: one pass of two scored (a third errored); 1: none
    for example, index, reward in [(0, 0, 1.0), (0, 1, 0.0), (0, 2, None), (1, 0, None)]:
        mixed.add(record(example, index, reward))
    assert mixed.to_dict()["reward_mean"] == 0.5
    assert mixed.pass_at() == {1: 0.5, 2: 1.0}
