"""``vfops env``: create, install and list environment packages."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from vfops._errors import VfopsError

app = typer.Typer(help="Create, install and list environment packages.", no_args_is_help=True)

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_TEMPLATES = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "module.py.tmpl": "{name}.py",
    "README.md.tmpl": "README.md",
    "test_module.py.tmpl": "tests/test_{name}.py",
}


def init_environment(name: str, parent: Path) -> Path:
    """Write a new environment package ``parent/name`` from the template."""
    if not _NAME.match(name):
        raise VfopsError(
            f"invalid environment name '{name}': use lowercase letters, digits and "
            "underscores, starting with a letter (e.g. my_env)"
        )
    target = parent / name
    if target.exists():
        raise VfopsError(f"{target} already exists; choose another name or --path")
    templates = resources.files("vfops") / "templates" / "environment"
    rendered = {
        dest.format(name=name): (templates / source).read_text().format(name=name)
        for source, dest in _TEMPLATES.items()
    }
    for relative, text in rendered.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return target


def install_environment(
    path: Path, *, editable: bool = False, target: Path | None = None, no_deps: bool = False
) -> None:
    """pip-install an environment package into this interpreter's environment.

    ``target`` installs into a folder instead (put it on ``PYTHONPATH``).
    """
    if not (path / "pyproject.toml").exists():
        raise VfopsError(
            f"{path} is not an environment package (no pyproject.toml); "
            "create one with: vfops env init NAME"
        )
    command = [sys.executable, "-m", "pip", "install", "--quiet"]
    if target is not None:
        command += ["--target", str(target)]
    if no_deps:
        command.append("--no-deps")
    command += ["--editable", str(path)] if editable else [str(path)]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise VfopsError(f"installing {path} failed: {_pip_error(completed.stderr)}")


def _pip_error(stderr: str) -> str:
    # pip ends with generic notes; the line that says what broke starts with ERROR.
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.upper().startswith("ERROR")]
    return (errors or lines or ["pip failed"])[-1]


@app.command("init")
def init_command(
    name: Annotated[str, typer.Argument(help="Environment name (a Python module name).")],
    path: Annotated[Path, typer.Option(help="Parent folder.")] = Path("environments"),
) -> None:
    """Create an environment package from the template."""
    target = init_environment(name, path)
    print(f"created {target}; install it with: vfops env install {target}")


@app.command("install")
def install_command(
    path: Annotated[Path, typer.Argument(help="Folder of an environment package.")],
    editable: Annotated[bool, typer.Option("--editable", "-e", help="Editable install.")] = False,
    target: Annotated[
        Path | None, typer.Option(help="Install into this folder (add it to PYTHONPATH).")
    ] = None,
    no_deps: Annotated[bool, typer.Option(help="Do not install dependencies.")] = False,
) -> None:
    """Install an environment package (pip) so vfops can load it by name."""
    install_environment(path, editable=editable, target=target, no_deps=no_deps)
    print(f"installed {path}")


@app.command("list")
def list_command() -> None:
    """List installed environments."""
    from vfops.envs import installed_environments

    table = Table("name", "package", "version", "entry point")
    for name, entry in sorted(installed_environments().items()):
        dist = entry.dist
        table.add_row(name, dist.name if dist else "?", dist.version if dist else "?", entry.value)
    Console().print(table)
