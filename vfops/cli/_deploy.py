"""``vfops deploy``: register every Prefect deployment against a work pool.

The command only parses and checks; what a deploy does (pools, deployments, automations)
is :mod:`vfops.orchestration`'s, and the flows are found by their entry points.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from vfops._errors import VfopsError
from vfops.orchestration import DeployOptions


def _help(name: str) -> str:
    return DeployOptions.model_fields[name].description or ""


def _nightly_deployment(path: Path | None, cron: str | None) -> dict[str, Any]:
    """``deploy_all``'s nightly argument from the checked ``nightly.toml`` (none without it)."""
    if path is None:
        if cron is not None:
            raise VfopsError("--nightly-cron needs --nightly-config nightly.toml")
        return {}
    from vfops.nightly import load_nightly
    from vfops.orchestration import NightlyDeployment

    spec = load_nightly(path, cron=cron)
    return {
        "nightly": NightlyDeployment(
            cron=spec.schedule.cron, parameters=spec.deployment_parameters()
        )
    }


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
    from vfops.orchestration import check_api, configured_api_url, deploy_all, flow_entry_points

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
    if not flow_entry_points():
        raise VfopsError(
            "no flows are registered (entry-point group vfops.flows); install vfops "
            "(pip install vfops, or pip install -e . in a checkout) and run vfops deploy again"
        )
    api = configured_api_url()
    asyncio.run(check_api(api))
    deployed = asyncio.run(deploy_all(options, **nightly))
    for name, object_id in sorted(deployed.items()):
        kind = "deployed" if "/" in name else "automation"
        print(f"{kind} {name} ({object_id}) to {api}")
    print(f"start a worker with: prefect worker start --pool {options.work_pool}")
