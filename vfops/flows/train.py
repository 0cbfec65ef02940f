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

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact

from vfops.orchestration import gpu_slots
from vfops.reports import RewardCurve, training_markdown, training_progress_log
from vfops.training import resolve_config, train_async

REPORT_KEY = "train-grpo"


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
    async with gpu_slots(gpu_limit, gpus):
        result = await train_async(
            config, num_processes=num_processes, progress=training_progress_log(logger, curve)
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
