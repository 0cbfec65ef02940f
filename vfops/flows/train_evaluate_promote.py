"""``train-evaluate-promote``: the loop as one flow run, a thin layer over
:func:`vfops.models.train_evaluate_promote_async`.

Trains a policy with GRPO from a TOML config (per-step metrics in MLflow; the
run's log shows each step), registers the checkpoint in the MLflow model
registry, and asks the evidence gate to move ``alias`` to it: the candidate and
the current holder are evaluated on the gate environments (registry runs with
MLflow runs) and compared. A refusal is reported, not failed: the flow returns
the decision and its markdown artifact names the environment and the delta.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact

from vfops.models import LoopRequest, train_evaluate_promote_async
from vfops.orchestration import gpu_slots
from vfops.reports import loop_markdown, report_key, training_progress_log
from vfops.tracking import mlflow_run_link

REPORT_KEY = "train-evaluate-promote"


@flow(name="train-evaluate-promote", validate_parameters=True)
async def train_evaluate_promote_flow(
    config_path: str,
    register_as: str,
    gate_envs: list[str],
    alias: str = "champion",
    steps: int | None = None,
    output_dir: str | None = None,
    gate_examples: int = 20,
    gate_rollouts: int = 1,
    gate_sampling_args: dict[str, Any] | None = None,
    gpus: int = 0,
    gpu_limit: str = "gpu",
) -> dict[str, Any]:
    """Train, register, and promote the checkpoint to ``alias`` on evidence.

    Args:
        config_path: Training config (TOML) on the worker's machine.
        register_as: MLflow registered model name of the checkpoint.
        gate_envs: Installed environments the gate evaluates candidate and holder on.
        alias: The alias to move on evidence.
        steps: Override ``[run] steps``.
        output_dir: Override ``[run] output_dir``.
        gate_examples: Examples per gate environment.
        gate_rollouts: Rollouts per example.
        gate_sampling_args: Sampling arguments of the gate's evaluations.
        gpus: GPUs the training uses (slots of ``gpu_limit`` it holds; 0 for CPU).
        gpu_limit: Name of the Prefect global concurrency limit that counts GPUs.
    """
    logger = get_run_logger()
    async with gpu_slots(gpu_limit, gpus):
        request = LoopRequest(
            config_path,
            register_as=register_as,
            gate_envs=gate_envs,
            alias=alias,
            steps=steps,
            output_dir=output_dir,
            gate_examples=gate_examples,
            gate_rollouts=gate_rollouts,
            gate_sampling_args=gate_sampling_args,
        )
        result = await train_evaluate_promote_async(request, progress=training_progress_log(logger))
    logger.info("%s: %s", result.model_uri, result.decision.reason)
    await acreate_markdown_artifact(
        key=report_key(REPORT_KEY, register_as),
        markdown=loop_markdown(result, _mlflow_run(result.training.mlflow_run_id)),
        description=f"{result.model_uri} -> @{alias}: {result.decision.outcome}",
    )
    return result.to_dict()


def _mlflow_run(mlflow_run_id: str | None) -> str:
    return "`-`" if mlflow_run_id is None else mlflow_run_link(mlflow_run_id, markdown=True)
