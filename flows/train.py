"""``train-grpo``: GRPO training as a Prefect flow, a thin layer over :func:`vfops.training.train`.

The run holds ``occupy = gpus`` slots of a Prefect global concurrency limit
(``gpu`` by default; created with ``limit = gpus`` when missing, otherwise left
as the operator set it, e.g. ``prefect gcl create gpu --limit 8``), under a
lease so a dead worker's slots come back (Prefect issue #17415). A CPU run
(``gpus = 0``) takes no slot. The entry point trains in the flow's own process,
or launches ``num_processes > 1`` (or a DeepSpeed config) under ``accelerate
launch``; either way each step and eval shows in the flow run's log. The final
checkpoint is registered in MLflow when the config (or ``register_as``) names a
model, and a markdown artifact reports the baseline and final held-out reward with
the reward curve (train reward per step, held-out reward at each eval) as a chart.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact

from vfops.reports import RewardCurve, training_markdown
from vfops.training import resolve_config, train_async

if TYPE_CHECKING:
    from vfops.training import Progress

REPORT_KEY = "train-grpo"
LEASE_S = 600.0


@flow(name="train-grpo", validate_parameters=True)
async def train_grpo(
    config_path: str,
    steps: int | None = None,
    output_dir: str | None = None,
    register_as: str | None = None,
    gpus: int = 0,
    gpu_limit: str = "gpu",
    num_processes: int = 1,
    deepspeed: str | None = None,
) -> dict[str, Any]:
    """Train with GRPO from a TOML config; returns the run summary.

    Args:
        config_path: Training config (TOML) on the worker's machine.
        steps: Override ``[run] steps``.
        output_dir: Override ``[run] output_dir``.
        register_as: Override ``[run] register_as`` (MLflow registered model name).
        gpus: GPUs the run uses (slots of ``gpu_limit`` it holds; 0 for CPU).
        gpu_limit: Name of the Prefect global concurrency limit that counts GPUs.
        num_processes: Training processes under accelerate launch (1: in-process).
        deepspeed: DeepSpeed JSON (configs/deepspeed/zero2.json or zero3.json).
    """
    # bad input fails the run before any slot is taken
    config = resolve_config(
        config_path,
        steps=steps,
        output_dir=output_dir,
        register_as=register_as,
        deepspeed=deepspeed,
    )
    logger = get_run_logger()
    curve = RewardCurve()
    async with _gpu_slots(gpu_limit, gpus):
        result = await train_async(
            config, num_processes=num_processes, progress=_log_progress(logger, curve)
        )
    summary = result.summary()
    logger.info(
        "held-out reward %.4f -> %.4f",
        summary["baseline_eval_reward"],
        summary["final_eval_reward"],
    )
    await acreate_markdown_artifact(
        key=REPORT_KEY,
        markdown=training_markdown(config_path, summary, curve.chart()),
        description="GRPO training: held-out reward before and after, reward curve",
    )
    return summary


@contextlib.asynccontextmanager
async def _gpu_slots(name: str, gpus: int) -> AsyncIterator[None]:
    if gpus <= 0:
        yield
        return
    from prefect.concurrency.asyncio import concurrency

    await _ensure_limit(name, gpus)
    async with concurrency(name, occupy=gpus, lease_duration=LEASE_S, strict=True):
        yield


async def _ensure_limit(name: str, gpus: int) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    async with get_client() as client:
        try:
            await client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):
                await client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=gpus)
                )


def _log_progress(logger: Any, curve: RewardCurve | None = None) -> Progress:
    """The flow run's log in the UI shows the run advancing, step by step; ``curve``
    (when given) keeps the points of the report's reward chart."""

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
