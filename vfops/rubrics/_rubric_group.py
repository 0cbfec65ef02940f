"""Several rubrics scored together: rewards add up, metrics merge."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence

from vfops._errors import VfopsError
from vfops._rollout import RolloutError
from vfops._types import State
from vfops.rubrics._rubric import RewardFunc, Rubric
from vfops.rubrics._score import RolloutScore


class RubricGroup(Rubric):
    """Runs its rubrics concurrently and sums their rewards.

    Metrics merge into one dict; a name that more than one rubric produces is
    prefixed with the rubric's index (``"0/correct"``, ``"1/correct"``). Any
    rubric's error makes the rollout's reward ``None`` (the first error is kept).
    """

    def __init__(self, rubrics: Sequence[Rubric]) -> None:
        if not rubrics:
            raise VfopsError("RubricGroup needs at least one rubric")
        self.rubrics = list(rubrics)
        super().__init__(parser=self.rubrics[0].parser)

    def add_reward_func(self, func: RewardFunc, weight: float = 1.0) -> None:
        """Adds to the first rubric (the group itself holds no functions)."""
        self.rubrics[0].add_reward_func(func, weight)

    @property
    def reward_func_names(self) -> list[str]:
        return self._renamed(self._names())

    @property
    def reward_weights(self) -> list[float]:
        return [w for rubric in self.rubrics for w in rubric.reward_weights]

    @property
    def metric_names(self) -> list[str]:
        return self._renamed([rubric.metric_names for rubric in self.rubrics])

    def _names(self) -> list[list[str]]:
        return [rubric.reward_func_names for rubric in self.rubrics]

    @staticmethod
    def _clashes(names: list[list[str]]) -> set[str]:
        counts = Counter(name for rubric_names in names for name in set(rubric_names))
        return {name for name, count in counts.items() if count > 1}

    def _renamed(self, names: list[list[str]]) -> list[str]:
        clashes = self._clashes(names)
        return [
            f"{index}/{name}" if name in clashes else name
            for index, rubric_names in enumerate(names)
            for name in rubric_names
        ]

    async def aclose(self) -> None:
        for rubric in self.rubrics:
            await rubric.aclose()

    async def score_group(self, states: list[State]) -> list[RolloutScore]:
        start = time.perf_counter()
        # Concurrently: sub-rubrics are often I/O bound (judges), so sequential would add up.
        results = await asyncio.gather(
            *(rubric.score_group(states) for rubric in self.rubrics), return_exceptions=True
        )
        results = [
            r
            if isinstance(r, BaseException) or len(r) == len(states)
            else ValueError(f"returned {len(r)} scores for {len(states)} rollouts")
            for r in results
        ]
        clashes = self._clashes([rubric.metric_names for rubric in self.rubrics])
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        merged: list[RolloutScore] = []
        for i in range(len(states)):
            reward: float | None = 0.0
            metrics: dict[str, float] = {}
            error: RolloutError | None = None
            for index, result in enumerate(results):
                if isinstance(result, BaseException):
                    if not isinstance(result, Exception):
                        raise result  # cancellation and the like must propagate
                    error = error or RolloutError(
                        type=type(result).__name__,
                        message=f"rubric {index} ({type(self.rubrics[index]).__name__}) "
                        f"raised: {result}"[:2000],
                        stage="scoring",
                    )
                    continue
                score = result[i]
                for name, value in score.metrics.items():
                    key = f"{index}/{name}" if name in clashes or name in metrics else name
                    metrics[key] = value
                if score.error is not None:
                    error = error or score.error
                if reward is not None and score.reward is not None:
                    reward += score.reward
            merged.append(RolloutScore(None if error else reward, metrics, error, elapsed_ms))
        return merged
