"""``vfops demo``: the whole loop on embedded defaults (see :mod:`vfops.demo`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DEFAULT_DIR = Path(".vfops-demo")


def demo_command(
    directory: Annotated[
        Path,
        typer.Option(
            "--dir",
            help="Folder for everything the demo makes (registry, artifacts, MLflow, "
            "Prefect, models); it must not hold an earlier demo.",
        ),
    ] = DEFAULT_DIR,
    steps: Annotated[
        int | None, typer.Option(help="GRPO steps (default: the shipped CPU config's).")
    ] = None,
    eval_examples: Annotated[
        int, typer.Option(help="Held-out examples per evaluation (64: the whole split).")
    ] = 64,
    nightly: Annotated[
        bool, typer.Option(help="Run the nightly flow on the champion (Prefect, ephemeral).")
    ] = True,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Keep the libraries' own output (Prefect's log lines, progress bars).",
        ),
    ] = False,
) -> None:
    """Publish, evaluate, train, register, promote on evidence, run the nightly on the
    champion: no API key, no GPU, no server to start."""
    from vfops.demo import DemoSettings, run_demo

    settings = DemoSettings(
        steps=steps, eval_examples=eval_examples, nightly=nightly, verbose=verbose
    )
    summary = run_demo(directory, settings, say=lambda line: print(line, flush=True))
    print(summary.render())
