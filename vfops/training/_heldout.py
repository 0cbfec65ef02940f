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
from pathlib import Path
from typing import Any

import orjson

from vfops._types import SamplingArgs, State
from vfops.envs import Example
from vfops.rubrics import RolloutScore
from vfops.training._config import GenerationConfig, RunConfig
from vfops.training._generation import Rollouts, derive


@dataclass(frozen=True, slots=True)
class HeldOut:
    """One held-out eval: its metrics and one row per example (what a paired test of two
    evals of the same run reads, example by example)."""

    metrics: dict[str, float]
    rows: list[dict[str, Any]]

    def rewards(self) -> dict[int, list[float]]:
        """example id -> its rewards (a failed rollout counts 0, as in the mean)."""
        return {int(row["example_id"]): [float(row["reward"] or 0.0)] for row in self.rows}


@dataclass(frozen=True, slots=True)
class HeldOutEval:
    """``run`` gives ``eval_examples``, ``eval_temperature`` and the seed; ``generation``
    the completion cap and the backend kind (seeded draws for ``hf`` only, as in training)."""

    run: RunConfig
    generation: GenerationConfig

    async def evaluate(self, rollouts: Rollouts, n: int | None = None) -> HeldOut:
        """``eval_reward`` (the mean; a failed rollout counts 0) and ``eval_examples``
        on the first ``n`` eval-split examples (default ``eval_examples``), one rollout
        each, with each example's row."""
        count = self.run.eval_examples if n is None else n
        examples = list(rollouts.env.iter_eval_examples(count))
        args: SamplingArgs = {
            "max_tokens": self.generation.max_tokens,
            "temperature": self.run.eval_temperature,
        }
        if self.generation.backend == "hf":
            args["seed"] = derive(self.run.seed, "eval")
        groups = await rollouts.groups(examples, [0], lambda _position: args)
        rows = [
            _row(example, state, score)
            for example, (states, scores) in zip(examples, groups, strict=True)
            for state, score in zip(states, scores, strict=True)
        ]
        rewards = [float(row["reward"] or 0.0) for row in rows]
        metrics = {"eval_reward": sum(rewards) / max(len(rewards), 1), "eval_examples": len(rows)}
        return HeldOut(metrics, rows)


def _row(example: Example, state: State, score: RolloutScore) -> dict[str, Any]:
    completion = state.get("completion") or []
    reply = "".join(str(m.get("content") or "") for m in completion if m.get("role") == "assistant")
    return {
        "example_id": example.example_id,
        "prompt": str(example.prompt[-1].get("content") or "") if example.prompt else "",
        "answer": example.answer,
        "completion": reply,
        "reward": score.reward,
        "error": None if score.error is None else score.error.message,
    }


def write_heldout_rows(output_dir: Path, step: int, rows: list[dict[str, Any]]) -> Path:
    """``output_dir/heldout/step-NNNNNN.jsonl``, one row per example, written whole."""
    from vfops._atomic import replace_file_atomically

    path = output_dir / "heldout" / f"step-{step:06d}.jsonl"
    data = b"".join(orjson.dumps(row) + b"\n" for row in rows)
    replace_file_atomically(path, data=data)
    return path
