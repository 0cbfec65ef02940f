"""Held-out eval during training: the current weights' mean reward on the eval split.

Imported by the recipe (lazily, with it). The recipe runs it before the first step, every
``[run] eval_every`` steps and after the last, through the same backend and
environment as training (:class:`~vfops.training._generation.Rollouts`), so the
number is comparable with the training rewards and costs no second model. The
full evaluation harness (``vfops eval``, :mod:`vfops.evaluation`) is for the saved
checkpoint; this is the quick in-loop signal.
"""

from __future__ import annotations

from dataclasses import dataclass

from vfops._types import SamplingArgs
from vfops.training._config import GenerationConfig, RunConfig
from vfops.training._generation import Rollouts, derive


@dataclass(frozen=True, slots=True)
class HeldOutEval:
    """``run`` gives ``eval_examples``, ``eval_temperature`` and the seed; ``generation``
    the completion cap and the backend kind (seeded draws for ``hf`` only, as in training)."""

    run: RunConfig
    generation: GenerationConfig

    async def evaluate(self, rollouts: Rollouts, n: int | None = None) -> dict[str, float]:
        """``eval_reward`` (the mean; a failed rollout counts 0) and ``eval_examples``
        on the first ``n`` eval-split examples (default ``eval_examples``), one rollout each."""
        count = self.run.eval_examples if n is None else n
        examples = list(rollouts.env.iter_eval_examples(count))
        args: SamplingArgs = {
            "max_tokens": self.generation.max_tokens,
            "temperature": self.run.eval_temperature,
        }
        if self.generation.backend == "hf":
            args["seed"] = derive(self.run.seed, "eval")
        groups = await rollouts.groups(examples, [0], lambda _position: args)
        rewards = [float(score.reward or 0.0) for _, scores in groups for score in scores]
        return {"eval_reward": sum(rewards) / max(len(rewards), 1), "eval_examples": len(rewards)}
