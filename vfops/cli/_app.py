"""The ``vfops`` command: one module per command group, registered here."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Annotated

import typer

from vfops._errors import VfopsError
from vfops.cli._help import ReadableGroup


def _add_eval(app: typer.Typer) -> None:
    from vfops.cli import _eval

    app.command("eval")(_eval.eval_command)


def _add_deploy(app: typer.Typer) -> None:
    from vfops.cli import _deploy

    # its help's first paragraph names every deployment: too long for the command list
    app.command(
        "deploy", short_help="Register vfops's deployments and automations on a work pool."
    )(_deploy.deploy_command)


def _add_promote(app: typer.Typer) -> None:
    from vfops.cli import _promote

    app.command("promote", cls=_promote.PromoteCommand)(_promote.promote_command)


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


def _add_plugins(app: typer.Typer) -> None:
    from vfops.cli import _plugins

    app.command("plugins")(_plugins.plugins_command)


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
    "sandbox": _group("sandbox"),
    "plugins": _add_plugins,
    "demo": _add_demo,
}
"""Every command (group), in help order; each module is imported only when added."""


def _print_version(value: bool) -> None:
    if value:
        from vfops._version import __version__

        typer.echo(f"vfops {__version__}")
        raise typer.Exit()


def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print vfops's version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    pass


def build_app(command: str | None = None) -> typer.Typer:
    """The ``vfops`` app; with ``command`` (a known command name), that command alone:
    ``vfops eval ...`` then does not import the other command modules (start-up)."""
    app = typer.Typer(
        name="vfops",
        cls=ReadableGroup,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
        # help texts are plain text: "[train]" is an extra's name, not rich markup
        rich_markup_mode=None,
    )
    # a callback keeps the app a group even with one command (typer would otherwise
    # make that command the root, and read "eval" as its first argument)
    app.callback(help="RL environments for LLMs: build, evaluate, publish, train.")(_root)
    if command == "--version":  # none of the command modules is needed
        return app
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


def _sqlite_error_line(exc: BaseException) -> str | None:
    """One line for a SQLite error of the registry that reached the top (the registry
    turns a damaged or read-only file into a VfopsError itself; this is for the rest:
    a disk I/O error, a full disk, a lock held past the busy timeout), else None."""
    sa_exc = sys.modules.get("sqlalchemy.exc")  # none of its errors without it
    if sa_exc is None or not isinstance(exc, sa_exc.DBAPIError):
        return None
    import sqlite3

    orig = exc.orig
    if not isinstance(orig, sqlite3.DatabaseError) or isinstance(
        orig, sqlite3.IntegrityError | sqlite3.ProgrammingError | sqlite3.InterfaceError
    ):
        return None  # a constraint or a malformed statement: a bug, worth its traceback
    where = ""
    if "--url" not in sys.argv:  # else not the default registry (vfops db --url ...)
        try:
            from vfops._settings import database_url
            from vfops.registry import mask_url

            where = f" {mask_url(database_url())}"
        except Exception:  # the line without the location, then
            pass
    reason = " ".join(str(orig).split()) or type(orig).__name__
    return (
        f"the registry database{where} failed ({reason}); check its file and folder (free "
        "space, permissions, another process holding it), or set VFOPS_HOME or "
        "VFOPS_DATABASE_URL to another database"
    )


def _reap_dead_sandboxes() -> None:
    # a `kill -9`ed run's containers go at the next start on the host: a listing of one
    # small folder when nothing died (vfops/sandbox/_owners.py)
    from vfops.sandbox import reap_dead_owners

    reap_dead_owners()


def run() -> None:
    """Entry point: user errors become one line on stderr and a non-zero exit."""
    _raise_open_file_limit()
    command = sys.argv[1] if len(sys.argv) > 1 else None
    try:
        _reap_dead_sandboxes()
        build_app(command)()
    except VfopsError as exc:
        from vfops.cli._exit_codes import error_exit_code

        print(f"error: {exc}", file=sys.stderr)
        sys.exit(error_exit_code(exc))
    except Exception as exc:
        line = _sqlite_error_line(exc)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        sys.exit(VfopsError.exit_code)
