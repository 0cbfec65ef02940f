"""Every vfops deployment, registered against a work pool by ``vfops deploy``.

Deployments point at this checkout (``from_source`` with a local folder), so a
process worker on a machine with the same checkout runs them; for other
machines, put the repository behind a git URL and pass it as ``source``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_WORK_POOL = "vfops-process"
DEFAULT_NIGHTLY_CRON = "0 3 * * *"


@dataclass(frozen=True)
class DeploymentSpec:
    """One deployment: the flow's module and function, its name, schedule and defaults."""

    module: str
    function: str
    name: str
    description: str
    cron: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def entrypoint(self) -> str:
        return f"{self.module.replace('.', '/')}.py:{self.function}"


def deployment_specs(
    *, nightly_cron: str = DEFAULT_NIGHTLY_CRON, nightly_parameters: dict[str, Any] | None = None
) -> list[DeploymentSpec]:
    specs = [
        DeploymentSpec(
            "flows.publish",
            "publish_environment_flow",
            "publish-environment",
            "Build, hash and register an environment version.",
        ),
        DeploymentSpec(
            "flows.eval_sweep",
            "eval_sweep",
            "eval-sweep",
            "Environments x endpoints x sampling configs, one task per cell.",
        ),
        DeploymentSpec(
            "flows.promote",
            "promote_checkpoint_flow",
            "promote-checkpoint",
            "Evaluate a registered checkpoint on the gate environments and move its alias.",
        ),
        DeploymentSpec(
            "flows.train",
            "train_grpo",
            "train-grpo",
            "GRPO training from a TOML config under the `gpu` concurrency limit.",
        ),
        DeploymentSpec(
            "flows.train_evaluate_promote",
            "train_evaluate_promote_flow",
            "train-evaluate-promote",
            "Train with GRPO, register the checkpoint, promote it to an alias on evidence.",
        ),
        DeploymentSpec(
            "flows.judge_score",
            "judge_score",
            "judge-score",
            "Re-score a run with a judge under a shared rate limit.",
        ),
    ]
    if nightly_parameters is not None:
        specs.append(
            DeploymentSpec(
                "flows.nightly",
                "nightly_eval",
                "nightly-eval",
                "Nightly sweep of the latest versions, compared with the previous night.",
                cron=nightly_cron,
                parameters=nightly_parameters,
            )
        )
    return [spec for spec in specs if _exists(spec)]


def _exists(spec: DeploymentSpec) -> bool:
    try:
        module = importlib.import_module(spec.module)
    except ModuleNotFoundError:
        return False
    return hasattr(module, spec.function)


async def ensure_process_pool(name: str) -> None:
    """Create the process work pool ``name`` unless it exists."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    async with get_client() as client:
        try:
            await client.read_work_pool(name)
        except ObjectNotFound:
            await client.create_work_pool(WorkPoolCreate(name=name, type="process"))


async def deploy_all(
    *,
    work_pool: str = DEFAULT_WORK_POOL,
    nightly_cron: str = DEFAULT_NIGHTLY_CRON,
    nightly_parameters: dict[str, Any] | None = None,
    source: str | None = None,
) -> dict[str, str]:
    """Register every deployment; returns ``{"flow-name/deployment-name": id}``."""
    from prefect import Flow

    await ensure_process_pool(work_pool)
    deployed: dict[str, str] = {}
    for spec in deployment_specs(nightly_cron=nightly_cron, nightly_parameters=nightly_parameters):
        flow: Any = await Flow.afrom_source(
            source=source or str(REPO_ROOT), entrypoint=spec.entrypoint
        )
        deployment_id = await flow.adeploy(
            name=spec.name,
            work_pool_name=work_pool,
            build=False,
            push=False,
            cron=spec.cron,
            parameters=spec.parameters or None,
            description=spec.description,
            print_next_steps=False,
            ignore_warnings=True,
        )
        deployed[f"{flow.name}/{spec.name}"] = str(deployment_id)
    return deployed
