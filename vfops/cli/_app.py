"""The ``vfops`` command: one module per command group, registered here."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

import typer

from vfops._errors import VfopsError


def _add_eval(app: typer.Typer) -> None:
    from vfops.cli import _eval

    app.command("eval")(_eval.eval_command)


def _add_deploy(app: typer.Typer) -> None:
    from vfops.cli import _deploy

    app.command("deploy")(_deploy.deploy_command)


def _add_promote(app: typer.Typer) -> None:
    from vfops.cli import _promote

    app.command("promote")(_promote.promote_command)


def _add_train(app: typer.Typer) -> None:
    from vfops.cli import _train

    app.command("train")(_train.train_command)


def _add_model(app: typer.Typer) -> None:
    from vfops.cli import _model, _promote

    _model.app.command("register")(_promote.register_command)
    app.add_typer(_model.app, name="model")


def _add_demo(app: typer.Typer) -> None:
    from vfops.cli import _demo

    app.command("demo")(_demo.demo_command)


def _group(name: str) -> Callable[[typer.Typer], None]:
    def add(app: typer.Typer) -> None:
        module = importlib.import_module(f"vfops.cli._{name}")
        app.add_typer(module.app, name=name)

    return add


_COMMANDS: dict[str, Callable[[typer.Typer], None]] = {
    "eval": _add_eval,
    "deploy": _add_deploy,
    "promote": _add_promote,
    "train": _add_train,
    "env": _group("env"),
    "model": _add_model,
    "runs": _group("runs"),
    "db": _group("db"),
    "vllm": _group("vllm"),
    "stack": _group("stack"),
    "demo": _add_demo,
}
"""Every command (group), in help order; each module is imported only when added."""


def _root() -> None:
    pass


def build_app(command: str | None = None) -> typer.Typer:
    """The ``vfops`` app; with ``command`` (a known command name), that command alone:
    ``vfops eval ...`` then does not import the other command modules (start-up)."""
    app = typer.Typer(
        name="vfops",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
        # help texts are plain text: "[train]" is an extra's name, not rich markup
        rich_markup_mode=None,
    )
    # a callback keeps the app a group even with one command (typer would otherwise
    # make that command the root, and read "eval" as its first argument)
    app.callback(help="RL environments for LLMs: build, evaluate, publish, train.")(_root)
    names = [command] if command in _COMMANDS else list(_COMMANDS)
    for name in names:
        _COMMANDS[name](app)
    return app


def __getattr__(name: str) -> typer.Typer:
    # ``app`` (every command) is built on first use: run() builds only what it needs
    if name == "app":
        app = build_app()
        globals()["app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    command = sys.argv[1] if len(sys.argv) > 1 else None
    try:
        build_app(command)()
    except VfopsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
