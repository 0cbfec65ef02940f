"""The result of scoring one rollout."""

from __future__ import annotations

from dataclasses import dataclass, field

from vfops._rollout import RolloutError


@dataclass(slots=True)
class RolloutScore:
    """Reward and per-function metrics of one rollout.

    ``reward`` is ``None`` when a reward function raised: the error is recorded in
    ``error`` instead of silently scoring 0.0.
    """

    reward: float | None
    metrics: dict[str, float] = field(default_factory=dict)
    error: RolloutError | None = None
    scoring_ms: float = 0.0
