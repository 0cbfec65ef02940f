"""Every vfops deployment, registered against a work pool by ``vfops deploy``.

The flows are found by their entry points (:mod:`vfops.orchestration._flows`); a
deployment points at the checkout that holds them (``from_source`` with a local folder),
so a process worker on a machine with the same checkout runs them; for other machines,
put the repository behind a git URL and pass it as ``source``. A docker or kubernetes
pool runs them in ``image`` (nothing is built or pushed here: the image must hold vfops
and the flows). The cell automations come with the deployments
(:mod:`vfops.orchestration._automations`).

What a deploy targets is one :class:`DeployOptions` (the CLI's flags are its fields), so
a new setting is one field, checked once, with its help text beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from vfops._config import ConfigModel
from vfops._errors import VfopsError
from vfops.orchestration._automations import (
    DEFAULT_HEARTBEAT_TIMEOUT_S,
    cell_automations,
    ensure_automations,
)
from vfops.orchestration._flows import FlowRef, flow_ref
from vfops.orchestration._pools import IMAGE_POOL_TYPES, ensure_work_pool

DEFAULT_WORK_POOL = "vfops-process"
DEFAULT_NIGHTLY_CRON = "0 3 * * *"
NIGHTLY = "nightly-eval"

# deployment name (= its flow's entry point in the vfops.flows group) -> description
_DEPLOYMENTS: dict[str, str] = {
    "publish-environment": "Build, hash and register an environment version.",
    "eval-sweep": "Environments x endpoints x sampling configs, one task per cell "
    "(distribute: one eval-sweep-cell flow run per cell).",
    "eval-sweep-cell": "One cell of a distributed eval sweep, on any worker of the pool "
    "(submitted by eval-sweep; a lost worker's cell is rescheduled).",
    "promote-checkpoint": "Evaluate a registered checkpoint on the gate environments and "
    "move its alias.",
    "train-grpo": "GRPO training from a TOML config under the `gpu` concurrency limit.",
    "train-evaluate-promote": "Train with GRPO, register the checkpoint, promote it to an "
    "alias on evidence.",
    "judge-score": "Re-score a run with a judge under a shared rate limit.",
}
_NIGHTLY_DESCRIPTION = "Nightly sweep of the latest versions, compared with the previous night."


@dataclass(frozen=True)
class DeploymentSpec:
    """One deployment: its flow (by entry point), description, schedule and defaults."""

    flow: FlowRef
    description: str
    cron: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.flow.name

    @property
    def module(self) -> str:
        return self.flow.module

    @property
    def function(self) -> str:
        return self.flow.function

    @property
    def entrypoint(self) -> str:
        return self.flow.entrypoint


@dataclass(frozen=True)
class NightlyDeployment:
    """The ``nightly-eval`` deployment's schedule and parameters (from ``nightly.toml``)."""

    cron: str = DEFAULT_NIGHTLY_CRON
    parameters: dict[str, Any] = field(default_factory=dict)


class DeployOptions(ConfigModel):
    """Where ``vfops deploy`` registers the deployments, and how cells are recovered."""

    work_pool: str = Field(
        default=DEFAULT_WORK_POOL,
        min_length=1,
        description="Prefect work pool; created with --pool-type when missing, used as it "
        "is when it exists (of any type).",
    )
    pool_type: Literal["process", "docker", "kubernetes"] = Field(
        default="process",
        description="Type of the work pool when it has to be created: process, docker or "
        "kubernetes.",
    )
    image: str | None = Field(
        default=None,
        min_length=1,
        description="Image the flow runs of a docker or kubernetes pool run in (the "
        "deployments' image job variable; nothing is built or pushed).",
    )
    heartbeat_timeout_s: float = Field(
        default=DEFAULT_HEARTBEAT_TIMEOUT_S,
        ge=35.0,
        description="Seconds without a heartbeat after which a cell flow run counts as lost "
        "(crashed, then rescheduled); above the workers' PREFECT_FLOWS_HEARTBEAT_FREQUENCY "
        "(at least 30).",
    )
    source: str | None = Field(
        default=None, description="Where workers get the flows (default: this checkout)."
    )

    @model_validator(mode="after")
    def _image_for_container_pools(self) -> Self:
        if self.pool_type in IMAGE_POOL_TYPES and not self.image:
            raise ValueError(
                f"a {self.pool_type} pool runs flows in an image; pass --image "
                "REGISTRY/NAME:TAG (an image with vfops and the flows)"
            )
        return self


def deployment_specs(
    *, nightly_cron: str = DEFAULT_NIGHTLY_CRON, nightly_parameters: dict[str, Any] | None = None
) -> list[DeploymentSpec]:
    """The deployments whose flows are installed; ``nightly-eval`` only with
    ``nightly_parameters`` (a nightly needs its ``nightly.toml``)."""
    wanted: list[tuple[str, str, str | None, dict[str, Any]]] = [
        (name, description, None, {}) for name, description in _DEPLOYMENTS.items()
    ]
    if nightly_parameters is not None:
        wanted.append((NIGHTLY, _NIGHTLY_DESCRIPTION, nightly_cron, nightly_parameters))
    specs = []
    for name, description, cron, parameters in wanted:
        flow = flow_ref(name)
        if flow is not None:  # an entry point whose module is gone deploys nothing
            specs.append(DeploymentSpec(flow, description, cron=cron, parameters=parameters))
    return specs


def configured_api_url() -> str:
    """The Prefect API the deployments go to (``PREFECT_API_URL``, from the environment or
    the active Prefect profile). Without one, Prefect would deploy to an ephemeral server
    that stops with this command, taking the deployments with it: refused in one line."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise VfopsError(
            "vfops deploy needs a running Prefect server (deployments on Prefect's ephemeral "
            "one vanish when this command exits); start one (prefect server start, or vfops "
            "stack up) and set PREFECT_API_URL, e.g. export PREFECT_API_URL="
            "http://127.0.0.1:4200/api"
        )
    return str(url)


async def check_api(api_url: str) -> None:
    """A Prefect API that does not answer fails in one line, before any deployment."""
    from prefect.client.orchestration import get_client

    try:
        async with get_client() as client:
            problem = await client.api_healthcheck()
    except Exception as exc:  # entering the client already talks to the server
        problem = exc
    if problem is not None:
        reason = " ".join(str(problem).split()) or type(problem).__name__
        raise VfopsError(
            f"cannot reach Prefect's API at {api_url} ({reason}); start it (prefect server "
            "start, or vfops stack up) or set PREFECT_API_URL to a running server"
        )


async def deploy_all(
    options: DeployOptions | None = None, *, nightly: NightlyDeployment | None = None
) -> dict[str, str]:
    """Register every deployment and the cell automations; returns
    ``{"flow-name/deployment-name": id, automation name: id}``."""
    from prefect import Flow

    options = options or DeployOptions()
    work_pool = options.work_pool
    actual_type = await ensure_work_pool(work_pool, options.pool_type)
    if actual_type in IMAGE_POOL_TYPES and not options.image:
        raise VfopsError(
            f"work pool {work_pool!r} is of type {actual_type}: its flow runs need an image; "
            "pass --image REGISTRY/NAME:TAG (an image with vfops and this checkout)"
        )
    job_variables = {"image": options.image} if options.image else None
    specs = deployment_specs(
        nightly_cron=nightly.cron if nightly else DEFAULT_NIGHTLY_CRON,
        nightly_parameters=nightly.parameters if nightly else None,
    )
    if not specs:
        raise VfopsError(
            "no flows are registered (entry-point group vfops.flows); install vfops "
            "(pip install vfops, or pip install -e . in a checkout) and run vfops deploy again"
        )
    deployed: dict[str, str] = {}
    for spec in specs:
        flow: Any = await Flow.afrom_source(
            source=options.source or str(spec.flow.root), entrypoint=spec.entrypoint
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
        automations = cell_automations(cell_id, heartbeat_timeout_s=options.heartbeat_timeout_s)
        deployed.update(await ensure_automations(automations))
    return deployed
