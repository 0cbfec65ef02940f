"""``vfops deploy``: register every Prefect deployment against a work pool."""

from __future__ import annotations

import asyncio
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any

import typer

from vfops._errors import VfopsError


def _nightly_parameters(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise VfopsError(f"cannot read nightly config {path}: {exc}") from exc
    nightly = data.get("nightly")
    if not isinstance(nightly, dict):
        raise VfopsError(f"{path} has no [nightly] table; see README (nightly sweeps)")
    return {"config": nightly}


def deploy_command(
    work_pool: Annotated[
        str, typer.Option(help="Prefect work pool (created as type process).")
    ] = "vfops-process",
    nightly_config: Annotated[
        Path | None,
        typer.Option(help="TOML with a [nightly] table: environments, endpoints, N, R, sampling."),
    ] = None,
    nightly_cron: Annotated[str, typer.Option(help="Cron schedule of nightly-eval.")] = "0 3 * * *",
    source: Annotated[
        str | None, typer.Option(help="Where workers get the flows (default: this checkout).")
    ] = None,
) -> None:
    """Register publish-environment, eval-sweep, judge-score and nightly-eval."""
    try:
        from flows.deployments import deploy_all
    except ModuleNotFoundError as exc:
        raise VfopsError(
            "the flows package is not importable; run vfops deploy from a checkout "
            "installed with: pip install -e ."
        ) from exc
    api = os.environ.get("PREFECT_API_URL") or "Prefect's ephemeral server"
    deployed = asyncio.run(
        deploy_all(
            work_pool=work_pool,
            nightly_cron=nightly_cron,
            nightly_parameters=_nightly_parameters(nightly_config),
            source=source,
        )
    )
    for name, deployment_id in sorted(deployed.items()):
        print(f"deployed {name} ({deployment_id}) to {api}")
    print(f"start a worker with: prefect worker start --pool {work_pool}")
