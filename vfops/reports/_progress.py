"""A training run's progress as log lines: what a flow run's log shows, step by step.

The same ``progress(kind, step, metrics)`` events :func:`vfops.training.train` reports
and :class:`RewardCurve` collects; the flows hand their run logger in, so the UI shows
the run advancing, and the curve (when given) keeps the report's chart points.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vfops.reports._markdown import RewardCurve


def training_progress_log(
    logger: logging.Logger | logging.LoggerAdapter[Any], curve: RewardCurve | None = None
) -> Callable[[str, int, dict[str, float]], None]:
    """A progress callback logging each step (reward, loss, throughput) and each
    held-out eval to ``logger``, feeding ``curve`` as well when given."""

    def progress(kind: str, step: int, metrics: dict[str, float]) -> None:
        if curve is not None:
            curve(kind, step, metrics)
        if kind == "eval":
            logger.info("step %d: held-out reward %.4f", step, metrics["eval_reward"])
        else:
            logger.info(
                "step %d: reward %.3f, loss %+.4f, %.0f tok/s",
                step,
                metrics["reward_mean"],
                metrics["loss"],
                metrics["tokens_per_s"],
            )

    return progress
