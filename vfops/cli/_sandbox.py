"""``vfops sandbox``: the base image, and what dead runs left behind."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(
    help="Sandbox containers: build the base image, list and remove leftovers.",
    no_args_is_help=True,
)


@app.command("build-image")
def build_image_command(
    force: Annotated[bool, typer.Option(help="Rebuild even if the image exists.")] = False,
) -> None:
    """Build the base image (Debian minbase + python3) unless its recipe's is there.

    Prints the image's name. The tag is the recipe's digest: rerunning is instant."""
    from vfops.sandbox import build_base_image, engine_name, engine_named

    engine = engine_named(engine_name())
    image, built = build_base_image(engine, force=force)
    typer.echo(image)
    typer.echo(f"{'built' if built else 'already built'}: {image}", err=True)


@app.command("gc")
def gc_command(
    run: Annotated[
        str | None, typer.Option(help="Remove this run's containers, its owner alive or not.")
    ] = None,
) -> None:
    """Remove sandbox containers whose owner process is dead, and say which."""
    from vfops.sandbox import collect_garbage, engine_name, engine_named

    report = collect_garbage(engine_named(engine_name()), run=run)
    for item in report.removed:
        where = f"run {item.run}" if item.run else "no run"
        rollout = f", rollout {item.rollout}" if item.rollout else ""
        typer.echo(f"removed {item.container[:12]} ({where}{rollout}; owner {item.owner})")
    typer.echo(
        f"{len(report.removed)} removed, {report.kept_live} in use by live processes", err=True
    )


@app.command("ps")
def ps_command() -> None:
    """List live sandbox containers: id, owner, run, rollout."""
    from vfops.sandbox import (
        OWNER_LABEL,
        ROLLOUT_LABEL,
        RUN_LABEL,
        SANDBOX_LABEL,
        CliEngine,
        engine_name,
        engine_named,
    )

    engine = engine_named(engine_name())
    found = engine.list_labelled(SANDBOX_LABEL)
    labels = engine.labels_of(found) if isinstance(engine, CliEngine) else {}
    for ident, mine in labels.items():
        typer.echo(
            f"{ident[:12]}  owner={mine.get(OWNER_LABEL, '-')}  run={mine.get(RUN_LABEL, '-')}"
            f"  rollout={mine.get(ROLLOUT_LABEL, '-')}"
        )
