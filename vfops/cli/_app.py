"""The ``vfops`` command: one module per command group, registered here."""

from __future__ import annotations

import sys

import typer

from vfops._errors import VfopsError
from vfops.cli import _db, _deploy, _env, _eval, _model, _promote, _runs, _train, _vllm

app = typer.Typer(
    name="vfops",
    help="RL environments for LLMs: build, evaluate, publish, train.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command("eval")(_eval.eval_command)
app.command("deploy")(_deploy.deploy_command)
app.command("promote")(_promote.promote_command)
app.command("train")(_train.train_command)
app.add_typer(_env.app, name="env")
_model.app.command("register")(_promote.register_command)
app.add_typer(_model.app, name="model")
app.add_typer(_runs.app, name="runs")
app.add_typer(_db.app, name="db")
app.add_typer(_vllm.app, name="vllm")


def _raise_open_file_limit() -> None:
    # Thousands of concurrent rollouts need as many sockets; 1024 is a common soft cap.
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = 65536 if hard == resource.RLIM_INFINITY else hard
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):  # not POSIX, or not permitted: keep the default
        pass


def run() -> None:
    """Entry point: user errors become one line on stderr and a non-zero exit."""
    _raise_open_file_limit()
    try:
        app()
    except VfopsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
