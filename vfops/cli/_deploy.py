"""``vfops deploy``: register every Prefect deployment against a work pool."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from vfops._errors import VfopsError


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
            "start) or set PREFECT_API_URL to a running server (unset: an ephemeral one)"
        )


def deploy_command(
    work_pool: Annotated[
        str, typer.Option(help="Prefect work pool (created as type process).")
    ] = "vfops-process",
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
    source: Annotated[
        str | None, typer.Option(help="Where workers get the flows (default: this checkout).")
    ] = None,
) -> None:
    """Register publish-environment, eval-sweep, judge-score and nightly-eval."""
    nightly = _nightly_deployment(nightly_config, nightly_cron)  # bad input: before Prefect
    try:
        from flows.deployments import deploy_all
    except ModuleNotFoundError as exc:
        raise VfopsError(
            "the flows package is not importable; run vfops deploy from a checkout "
            "installed with: pip install -e ."
        ) from exc
    api_url = os.environ.get("PREFECT_API_URL")
    if api_url:
        asyncio.run(_check_api(api_url))
    api = api_url or "Prefect's ephemeral server"
    deployed = asyncio.run(deploy_all(work_pool=work_pool, source=source, **nightly))
    for name, deployment_id in sorted(deployed.items()):
        print(f"deployed {name} ({deployment_id}) to {api}")
    print(f"start a worker with: prefect worker start --pool {work_pool}")
