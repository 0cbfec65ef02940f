"""``vfops deploy``: register every Prefect deployment against a work pool."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import typer
from pydantic import Field, model_validator

from vfops._config import ConfigModel
from vfops._errors import VfopsError

IMAGE_POOL_TYPES = ("docker", "kubernetes")


class DeployOptions(ConfigModel):
    """Where ``vfops deploy`` registers the deployments, and how cells are recovered."""

    work_pool: str = Field(
        default="vfops-process",
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
        default=90.0,
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


def _help(name: str) -> str:
    return DeployOptions.model_fields[name].description or ""


def _nightly_deployment(path: Path | None, cron: str | None) -> dict[str, Any]:
    """``deploy_all``'s nightly arguments from the checked ``nightly.toml`` (none without it)."""
    if path is None:
        if cron is not None:
            raise VfopsError("--nightly-cron needs --nightly-config nightly.toml")
        return {}
    from vfops.nightly import load_nightly

    spec = load_nightly(path, cron=cron)
    return {
        "nightly_cron": spec.schedule.cron,
        "nightly_parameters": spec.deployment_parameters(),
    }


def _configured_api_url() -> str:
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


async def _check_api(api_url: str) -> None:
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


def deploy_command(
    work_pool: Annotated[str, typer.Option(help=_help("work_pool"))] = "vfops-process",
    nightly_config: Annotated[
        Path | None,
        typer.Option(
            help="TOML with a [nightly] table (environments, endpoints, N, R, sampling) and "
            "an optional [schedule] cron; checked before anything is deployed."
        ),
    ] = None,
    nightly_cron: Annotated[
        str | None,
        typer.Option(help="Cron schedule of nightly-eval; overrides the file's [schedule] cron."),
    ] = None,
    source: Annotated[str | None, typer.Option(help=_help("source"))] = None,
    pool_type: Annotated[str, typer.Option(help=_help("pool_type"))] = "process",
    image: Annotated[str | None, typer.Option(help=_help("image"))] = None,
    heartbeat_timeout_s: Annotated[float, typer.Option(help=_help("heartbeat_timeout_s"))] = 90.0,
) -> None:
    """Register every vfops deployment on a work pool: publish-environment, eval-sweep,
    eval-sweep-cell, promote-checkpoint, train-grpo, train-evaluate-promote,
    judge-score and, with --nightly-config, nightly-eval; and the automations that
    reschedule a lost worker's sweep cell."""
    options = DeployOptions.from_data(
        {
            "work_pool": work_pool,
            "pool_type": pool_type,
            "image": image,
            "heartbeat_timeout_s": heartbeat_timeout_s,
            "source": source,
        },
        source="vfops deploy",
    )
    nightly = _nightly_deployment(nightly_config, nightly_cron)  # bad input: before Prefect
    try:
        from flows.deployments import deploy_all
    except ModuleNotFoundError as exc:
        raise VfopsError(
            "the flows package is not importable; run vfops deploy from a checkout "
            "installed with: pip install -e ."
        ) from exc
    api = _configured_api_url()
    asyncio.run(_check_api(api))
    deployed = asyncio.run(
        deploy_all(
            work_pool=options.work_pool,
            source=options.source,
            pool_type=options.pool_type,
            image=options.image,
            heartbeat_timeout_s=options.heartbeat_timeout_s,
            **nightly,
        )
    )
    for name, object_id in sorted(deployed.items()):
        kind = "deployed" if "/" in name else "automation"
        print(f"{kind} {name} ({object_id}) to {api}")
    print(f"start a worker with: prefect worker start --pool {options.work_pool}")
