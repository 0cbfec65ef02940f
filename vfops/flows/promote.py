"""``promote-checkpoint``: evidence-gated promotion of a registered model version.

A thin layer over :func:`vfops.models.promote_async`: evaluates the candidate
(and the current alias holder) on the gate environments, moves the alias only
on evidence, records the decision in the registry's ``alias_events`` table and
attaches a markdown artifact. A refused promotion fails the flow run with the
reason (which environment regressed and by how much).
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import acreate_markdown_artifact

from vfops.models import PromotionRequest, promote_async
from vfops.reports import promotion_markdown, report_key

REPORT_KEY = "promote-checkpoint"


@flow(name="promote-checkpoint", validate_parameters=True)
async def promote_checkpoint_flow(
    name: str,
    version: str,
    gate_envs: list[str],
    alias: str = "champion",
    num_examples: int = 20,
    rollouts_per_example: int = 1,
    metric: str = "reward_mean",
    sampling_args: dict[str, Any] | None = None,
    force: bool = False,
    actor: str | None = None,
    evidence_runs: dict[str, str] | None = None,
    reuse: bool = True,
) -> dict[str, Any]:
    """Promote registered model ``name`` version ``version`` to ``alias`` if the gate passes.

    Args:
        name: Registered model name in MLflow.
        version: The candidate version.
        gate_envs: Installed environments to evaluate on.
        alias: The alias to move.
        num_examples: Examples per gate environment.
        rollouts_per_example: Rollouts per example.
        metric: reward_mean or a rubric metric.
        sampling_args: Sampling arguments of the gate evals (same for both models).
        force: Move the alias even if the gate fails (recorded as forced).
        actor: Who asks (default: $USER of the worker).
        evidence_runs: Gate environment -> an existing completed registry run of the
            candidate to use instead of evaluating it.
        reuse: Use completed runs that answer the gate's exact request.
    """
    request = PromotionRequest(
        name,
        version,
        alias=alias,
        gate_envs=gate_envs,
        num_examples=num_examples,
        rollouts_per_example=rollouts_per_example,
        metric=metric,
        sampling_args=sampling_args,
        force=force,
        actor=actor,
        evidence_runs=evidence_runs,
        reuse=reuse,
    )
    decision = await promote_async(request)
    await acreate_markdown_artifact(
        markdown=promotion_markdown(name, decision),
        key=report_key(REPORT_KEY, name),
        description=f"{name} v{decision.to_version} -> @{alias}: {decision.outcome}",
    )
    decision.raise_if_refused()
    return decision.to_dict()
