"""The ``vfops`` command: one module per command group, registered here."""

from __future__ import annotations

import sys

import typer

from vfops._errors import VfopsError
from vfops.cli import _env, _eval, _model

app = typer.Typer(
    name="vfops",
    help="RL environments for LLMs: build, evaluate, publish, train.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command("eval")(_eval.eval_command)
app.add_typer(_env.app, name="env")
app.add_typer(_model.app, name="model")


def run() -> None:
    """Entry point: user errors become one line on stderr and a non-zero exit."""
    try:
        app()
    except VfopsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
