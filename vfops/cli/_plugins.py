"""``vfops plugins``: what other packages (and vfops itself) plug in, by entry point."""

from __future__ import annotations

import typer

GROUPS = {
    "vfops.environment_libraries": "environment libraries (vfops env list: their environments)",
    "vfops.eval_sinks": (
        "eval sinks (arrow, registry, mlflow: every run's own; others: vfops eval --sink "
        "NAME, specs' sinks)"
    ),
    "vfops.request_middleware": "request middleware (vfops eval --middleware NAME)",
    "vfops.losses": "loss variants ([loss] type = NAME)",
    "vfops.container_engines": "sandbox container engines (VFOPS_SANDBOX_ENGINE=NAME)",
    "vfops.flows": "Prefect flows (vfops deploy)",
}


def plugins_command() -> None:
    """List every plug-in by entry-point group: its name, where it comes from, its package."""
    from importlib.metadata import entry_points

    for group, what in GROUPS.items():
        found = sorted(entry_points(group=group), key=lambda ep: ep.name)
        typer.echo(f"{group}: {what}")
        for ep in found:
            package = ep.dist.name if ep.dist is not None else "?"
            typer.echo(f"  {ep.name:<20} {ep.value}  ({package})")
        if not found:
            typer.echo("  (none)")
