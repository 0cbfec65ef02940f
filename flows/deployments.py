"""Every vfops deployment, registered against a work pool by ``vfops deploy``.

Deployments point at this checkout (``from_source`` with a local folder), so a
process worker on a machine with the same checkout runs them; for other
machines, put the repository behind a git URL and pass it as ``source``. A
docker or kubernetes pool runs them in ``image`` (nothing is built or pushed
here: the image must hold vfops and the flows).

Two automations come with the deployments (created or updated, never duplicated):
a cell flow run of a distributed sweep whose heartbeats stop (its worker was lost)
is marked Crashed, and a crashed cell flow run is scheduled again, for another
worker to resume (the cell flow refuses to start past ``MAX_CELL_RUNS``).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, get_args

from vfops._errors import VfopsError

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_WORK_POOL = "vfops-process"
DEFAULT_NIGHTLY_CRON = "0 3 * * *"

PoolType = Literal["process", "docker", "kubernetes"]
POOL_TYPES: tuple[str, ...] = get_args(PoolType)
IMAGE_POOL_TYPES = frozenset({"docker", "kubernetes"})

ZOMBIE_AUTOMATION = "vfops: crash eval-sweep-cell runs without heartbeats"
RESCHEDULE_AUTOMATION = "vfops: reschedule crashed eval-sweep-cell runs"
DEFAULT_HEARTBEAT_TIMEOUT_S = 90.0
"""Seconds without a heartbeat after which a cell flow run counts as lost: three of
Prefect's 30 s minimum heartbeat interval (PREFECT_FLOWS_HEARTBEAT_FREQUENCY on the
workers must be below it)."""
_FINAL_EVENTS = frozenset(
    f"prefect.flow-run.{state}" for state in ("Completed", "Failed", "Cancelled", "Crashed")
)


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
            "Environments x endpoints x sampling configs, one task per cell "
            "(distribute: one eval-sweep-cell flow run per cell).",
        ),
        DeploymentSpec(
            "flows.eval_sweep",
            "eval_sweep_cell",
            "eval-sweep-cell",
            "One cell of a distributed eval sweep, on any worker of the pool (submitted by "
            "eval-sweep; a lost worker's cell is rescheduled).",
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


def default_job_template(pool_type: str) -> dict[str, Any]:
    """The base job template of a ``pool_type`` pool, from the installed worker class or
    the worker metadata bundled with Prefect (no network: the public collection registry
    may be out of reach, and creating a pool needs no worker of its type)."""
    from prefect.workers.base import BaseWorker

    worker_class = BaseWorker.get_worker_class_from_type(pool_type)
    if worker_class is not None:
        return dict(worker_class.get_default_base_job_template())
    import prefect.server.api as server_api

    bundled = (
        Path(server_api.__file__).parent
        / "collections_data"
        / "views"
        / "aggregate-worker-metadata.json"
    )
    for collection in json.loads(bundled.read_text()).values():
        for worker in collection.values():
            if worker.get("type") == pool_type:
                return dict(worker["default_base_job_configuration"])
    raise ValueError(f"no job template for work pool type {pool_type!r}")


async def ensure_work_pool(name: str, pool_type: str = "process") -> str:
    """Create the work pool ``name`` of ``pool_type`` unless it exists; the pool's type
    (an existing pool is used as it is, whatever its type)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    if pool_type not in POOL_TYPES:
        raise VfopsError(f"unknown work pool type {pool_type!r}; use one of {POOL_TYPES}")
    async with get_client() as client:
        try:
            return str((await client.read_work_pool(name)).type)
        except ObjectNotFound:
            pass
        create = WorkPoolCreate(
            name=name, type=pool_type, base_job_template=default_job_template(pool_type)
        )
        try:
            return str((await client.create_work_pool(create)).type)
        except ObjectAlreadyExists:  # created by a concurrent vfops deploy
            return str((await client.read_work_pool(name)).type)


async def ensure_process_pool(name: str) -> None:
    """Create the process work pool ``name`` unless it exists."""
    await ensure_work_pool(name, "process")


def cell_automations(
    cell_deployment_id: str, *, heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
) -> list[Any]:
    """The two automations that recover a cell whose worker was lost.

    Zombie detection (Prefect's documented pattern): after a cell flow run is Running or
    heartbeats, expect its next heartbeat (or its end) within ``heartbeat_timeout_s``,
    per flow run; when none comes, mark it Crashed. Recovery: when a cell flow run is
    Crashed, schedule the same run again (forced: Crashed is terminal), so a worker of
    the pool picks it up and resumes the cell's registry run.
    """
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    cell_runs = ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"})
    of_cell_deployment = ResourceSpecification(
        {
            "prefect.resource.id": f"prefect.deployment.{cell_deployment_id}",
            "prefect.resource.role": "deployment",
        }
    )
    zombie = AutomationCore(
        name=ZOMBIE_AUTOMATION,
        description=(
            f"A flow run of eval-sweep-cell without a heartbeat for {heartbeat_timeout_s:g} s "
            "lost its worker: mark it Crashed (created by vfops deploy)."
        ),
        trigger=EventTrigger(
            match=cell_runs,
            match_related=of_cell_deployment,
            after={"prefect.flow-run.Running", "prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *_FINAL_EVENTS},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=heartbeat_timeout_s),
        ),
        actions=[
            ChangeFlowRunState(
                name=None,
                state=StateType.CRASHED,
                message=f"no heartbeat for {heartbeat_timeout_s:g} s: its worker was lost",
                force=False,
            )
        ],
    )
    reschedule = AutomationCore(
        name=RESCHEDULE_AUTOMATION,
        description=(
            "A crashed flow run of eval-sweep-cell is scheduled again, for another worker to "
            "resume its registry run (created by vfops deploy)."
        ),
        trigger=EventTrigger(
            match=cell_runs,
            match_related=of_cell_deployment,
            expect={"prefect.flow-run.Crashed"},
            posture=Posture.Reactive,
            threshold=1,
        ),
        actions=[
            ChangeFlowRunState(
                name=None,
                state=StateType.SCHEDULED,
                message="rescheduled after a crash: another worker resumes the cell",
                force=True,
            )
        ],
    )
    return [zombie, reschedule]


async def ensure_automations(automations: list[Any]) -> dict[str, str]:
    """Create each automation, or update the one of the same name (idempotent: a second
    ``vfops deploy`` leaves one of each); returns ``{name: id}``."""
    from prefect.client.orchestration import get_client

    ids: dict[str, str] = {}
    async with get_client() as client:
        for automation in automations:
            existing = await client.read_automations_by_name(automation.name)
            if not existing:
                ids[automation.name] = str(await client.create_automation(automation))
                continue
            keep, *duplicates = existing
            # the new trigger and actions; a pause someone chose stays
            update = automation.model_copy(update={"enabled": keep.enabled})
            await client.update_automation(keep.id, update)
            for duplicate in duplicates:  # left by concurrent deploys: one of each
                await client.delete_automation(duplicate.id)
            ids[automation.name] = str(keep.id)
    return ids


async def deploy_all(
    *,
    work_pool: str = DEFAULT_WORK_POOL,
    nightly_cron: str = DEFAULT_NIGHTLY_CRON,
    nightly_parameters: dict[str, Any] | None = None,
    source: str | None = None,
    pool_type: str = "process",
    image: str | None = None,
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
) -> dict[str, str]:
    """Register every deployment and the cell automations; returns
    ``{"flow-name/deployment-name": id, automation name: id}``."""
    from prefect import Flow

    actual_type = await ensure_work_pool(work_pool, pool_type)
    if actual_type in IMAGE_POOL_TYPES and not image:
        raise VfopsError(
            f"work pool {work_pool!r} is of type {actual_type}: its flow runs need an image; "
            "pass --image REGISTRY/NAME:TAG (an image with vfops and this checkout)"
        )
    job_variables = {"image": image} if image else None
    deployed: dict[str, str] = {}
    for spec in deployment_specs(nightly_cron=nightly_cron, nightly_parameters=nightly_parameters):
        flow: Any = await Flow.afrom_source(
            source=source or str(REPO_ROOT), entrypoint=spec.entrypoint
        )
        # to_deployment + apply, not adeploy: the same deployment, without the table
        # and hints adeploy prints per call (the CLI prints one summary)
        deployment = await flow.ato_deployment(
            name=spec.name,
            work_pool_name=work_pool,
            cron=spec.cron,
            parameters=spec.parameters or None,
            description=spec.description,
            job_variables=job_variables,
        )
        deployment_id = await deployment.aapply(work_pool_name=work_pool)
        deployed[f"{flow.name}/{spec.name}"] = str(deployment_id)
    cell_id = deployed.get("eval-sweep-cell/eval-sweep-cell")
    if cell_id is not None:
        automations = cell_automations(cell_id, heartbeat_timeout_s=heartbeat_timeout_s)
        deployed.update(await ensure_automations(automations))
    return deployed
