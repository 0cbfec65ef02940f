"""Paired comparison of two runs, aligned on example_id.

Run A is the baseline and run B the candidate: every delta is B - A (candidate -
baseline), so a positive delta means the candidate scored higher.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


@dataclass(frozen=True)
class ExampleDelta:
    example_id: int
    reward_a: float
    reward_b: float
    passed_a: bool
    passed_b: bool

    @property
    def delta(self) -> float:
        """Candidate (B) minus baseline (A)."""
        return self.reward_b - self.reward_a


@dataclass
class RunComparison:
    run_a: str
    run_b: str
    pass_threshold: float
    examples: list[ExampleDelta] = field(default_factory=list)
    only_in_a: int = 0
    only_in_b: int = 0

    @property
    def mean_delta(self) -> float:
        if not self.examples:
            return 0.0
        return sum(e.delta for e in self.examples) / len(self.examples)

    @property
    def flipped_to_pass(self) -> list[ExampleDelta]:
        return [e for e in self.examples if not e.passed_a and e.passed_b]

    @property
    def flipped_to_fail(self) -> list[ExampleDelta]:
        return [e for e in self.examples if e.passed_a and not e.passed_b]


def per_example_rewards(engine: Engine, run_id: str) -> dict[int, list[float]]:
    """Rewards of each example (errored rollouts count as 0.0: they did not pass)."""
    from vfops.registry import iter_rollout_scores, session_scope

    rewards: dict[int, list[float]] = {}
    with session_scope(engine, write=False) as session:
        for score in iter_rollout_scores(session, run_id):
            rewards.setdefault(score.example_id, []).append(score.reward or 0.0)
    return rewards


def compare_runs(
    engine: Engine, run_a: str, run_b: str, *, pass_threshold: float = 1.0
) -> RunComparison:
    """Mean reward per example in the baseline ``run_a`` and the candidate ``run_b``, the
    deltas (candidate - baseline), and which examples flipped.

    An example passes when its mean reward over its rollouts reaches ``pass_threshold``.
    """
    a = per_example_rewards(engine, run_a)
    b = per_example_rewards(engine, run_b)
    comparison = RunComparison(run_a=run_a, run_b=run_b, pass_threshold=pass_threshold)
    for example_id in sorted(a.keys() & b.keys()):
        mean_a = sum(a[example_id]) / len(a[example_id])
        mean_b = sum(b[example_id]) / len(b[example_id])
        comparison.examples.append(
            ExampleDelta(
                example_id=example_id,
                reward_a=mean_a,
                reward_b=mean_b,
                passed_a=mean_a >= pass_threshold,
                passed_b=mean_b >= pass_threshold,
            )
        )
    comparison.only_in_a = len(a.keys() - b.keys())
    comparison.only_in_b = len(b.keys() - a.keys())
    return comparison
