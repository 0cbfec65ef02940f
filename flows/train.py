"""``train-grpo``: GRPO training as a Prefect flow, a thin layer over :mod:`vfops.training`.

The run holds ``occupy = gpus`` slots of a Prefect global concurrency limit
(``gpu`` by default; created with ``limit = gpus`` when missing, otherwise left
as the operator set it, e.g. ``prefect gcl create gpu --limit 8``), under a
lease so a dead worker's slots come back (Prefect issue #17415). A CPU run
(``gpus = 0``) takes no slot. One process trains in the flow's own process;
``num_processes > 1`` or a DeepSpeed config runs ``vfops train`` under
``accelerate launch``. The final checkpoint is registered in MLflow when the
config (or ``register_as``) names a model, and a markdown artifact reports the
baseline and final held-out reward.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact

from vfops.training import load_config

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
    config = load_config(config_path)  # bad input fails the run before any slot is taken
    overrides = {"run.steps": steps, "run.output_dir": output_dir, "run.register_as": register_as}
    config = config.with_overrides({k: v for k, v in overrides.items() if v is not None})
    logger = get_run_logger()
    async with _gpu_slots(gpu_limit, gpus):
        if num_processes > 1 or deepspeed:
            summary = await asyncio.to_thread(
                _launch, config_path, steps, output_dir, register_as, num_processes, deepspeed
            )
        else:
            summary = await asyncio.to_thread(_train_in_process, config, logger)
    logger.info(
        "held-out reward %.4f -> %.4f",
        summary["baseline_eval_reward"],
        summary["final_eval_reward"],
    )
    await acreate_markdown_artifact(key=REPORT_KEY, markdown=_report(config_path, summary))
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


def _train_in_process(config: Any, logger: Any) -> dict[str, Any]:
    from vfops.training import GRPORecipe

    def progress(kind: str, step: int, metrics: dict[str, float]) -> None:
        # the flow run's log in the UI shows the run advancing, step by step
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

    with GRPORecipe(config) as recipe:
        recipe.setup()
        result = recipe.train(progress)
    return {k: v for k, v in result.items() if k != "history"}


def _launch(
    config_path: str,
    steps: int | None,
    output_dir: str | None,
    register_as: str | None,
    num_processes: int,
    deepspeed: str | None,
) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "vfops", "train", config_path]
    cmd += ["--num-processes", str(num_processes)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    if output_dir is not None:
        cmd += ["--output-dir", output_dir]
    if register_as is not None:
        cmd += ["--register-as", register_as]
    if deepspeed:
        cmd += ["--deepspeed", deepspeed]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"vfops train failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _report(config_path: str, summary: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"# GRPO training: `{config_path}`",
            "",
            "| baseline held-out reward | final held-out reward | steps | checkpoint | model |",
            "|---|---|---|---|---|",
            f"| {summary['baseline_eval_reward']:.4f} | {summary['final_eval_reward']:.4f} | "
            f"{summary['steps']} | `{summary['checkpoint']}` | {summary.get('registered') or '-'}"
            " |",
        ]
    )
