"""``vfops env``: create, install and list environment packages."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from vfops._errors import InvalidArgumentError, VfopsError
from vfops.artifacts import DEFAULT_GC_GRACE_HOURS

app = typer.Typer(
    help="Create, install, publish, list and show environment packages; garbage-collect "
    "their unreferenced artifacts.",
    no_args_is_help=True,
)

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
    source: Annotated[
        str | None,
        typer.Argument(
            help="A package folder, or NAME[@VERSION] from the registry; or --example NAME.",
            show_default=False,
        ),
    ] = None,
    example: Annotated[
        str | None,
        typer.Option(
            "--example",
            help="An example environment shipped inside vfops instead of SOURCE (arithmetic, "
            "calculator, code_exec, guess_number, judged_qa, lucky_digit, mixed, reverse_text).",
            show_default=False,
        ),
    ] = None,
    editable: Annotated[bool, typer.Option("--editable", "-e", help="Editable install.")] = False,
    target: Annotated[
        Path | None, typer.Option(help="Install into this folder (add it to PYTHONPATH).")
    ] = None,
    no_deps: Annotated[
        bool, typer.Option("--no-deps", help="Do not install dependencies.")
    ] = False,
) -> None:
    """Install an environment package so vfops can load it by name.

    A folder is pip-installed as it is; NAME or NAME@VERSION downloads the
    published wheel, verifies its sha256 and its archive paths, then installs it;
    --example NAME installs a copy of an example that ships inside vfops.
    """
    if example is not None or source is None:
        _install_example(example, source, editable=editable, target=target, no_deps=no_deps)
        return
    path = Path(source)
    if path.is_dir() or "/" in source or source.startswith("."):
        install_environment(path, editable=editable, target=target, no_deps=no_deps)
        print(f"installed {path}")
        return
    from vfops.publishing import install_published

    row = install_published(source, target=target, no_deps=no_deps)
    print(
        f"installed {row.environment.name}@{row.version} (sha256 {row.wheel_sha256[:12]} verified)"
    )


def _install_example(
    name: str | None, source: str | None, *, editable: bool, target: Path | None, no_deps: bool
) -> None:
    """pip-install a copy of the example ``name`` (the wheel's own folder may be read-only
    and pip builds in place); nothing when it is installed from these very files already
    (a checkout's editable install: re-installing would replace it with a copy)."""
    if name is None or source is not None:
        raise InvalidArgumentError(
            "give one environment: SOURCE (a folder or NAME[@VERSION]) or --example NAME (not both)"
        )
    if editable:
        raise InvalidArgumentError(
            "--example installs a copy; to edit an example, copy its folder "
            "(vfops env init makes a new one) and vfops env install -e the copy"
        )
    from vfops._examples import example_environment

    project = example_environment(name)
    installed_from = _installed_from(name)
    if target is None and installed_from is not None and installed_from.is_relative_to(project):
        print(f"{name} is installed from {project} already (editable)")
        return
    with _example_copy(project) as copy:
        install_environment(copy, target=target, no_deps=no_deps)
    print(f"installed the example {name}")


@contextmanager
def _example_copy(project: Path) -> Iterator[Path]:
    """A copy of an example's project folder, for the block: pip and the publisher build
    in place, and the wheel's own folder may be read-only."""
    with tempfile.TemporaryDirectory(prefix="vfops-example-") as tmp:
        copy = Path(tmp) / project.name
        ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")  # never hashed
        shutil.copytree(project, copy, ignore=ignore)
        yield copy


def _installed_from(module: str) -> Path | None:
    """The file the installed module ``module`` loads from (links resolved), if any."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).resolve() if spec is not None and spec.origin else None


@app.command("publish")
def publish_command(
    path: Annotated[
        Path | None,
        typer.Argument(
            help="Folder of an environment package; or --example NAME.", show_default=False
        ),
    ] = None,
    example: Annotated[
        str | None,
        typer.Option(
            "--example",
            help="Publish an example environment shipped inside vfops (as it ships: its "
            "content is the checkout's environments/NAME).",
            show_default=False,
        ),
    ] = None,
    bump: Annotated[
        str | None, typer.Option(help="Publish a new version: patch, minor or major.")
    ] = None,
) -> None:
    """Build, hash, snapshot datasets, upload and register a new version.

    Content already published (same content hash) publishes nothing and names its
    version. The content hash covers every file under PATH except:

    \b
    - anywhere: __pycache__, .git, .mypy_cache, .ruff_cache, .pytest_cache
      and *.egg-info folders, *.pyc and *.pyo files;
    - at PATH's root only: the build, dist, outputs, .venv, venv, .tox and
      .eggs folders (a sub-folder named build, dist or outputs is hashed);
    - the version line of pyproject.toml.
    """
    from vfops.publishing import publish_environment

    if bump not in (None, "patch", "minor", "major"):
        raise VfopsError(f"--bump must be patch, minor or major, not {bump!r}")
    if (path is None) == (example is None):
        raise InvalidArgumentError(
            "give one environment: PATH (a package folder) or --example NAME (not both)"
        )
    if example is None:
        result = publish_environment(path, bump=bump)  # type: ignore[arg-type]
    elif bump is not None:
        raise InvalidArgumentError(
            "--bump changes the package's version in its folder; an example publishes as it "
            "ships: to change it, copy its folder and publish the copy"
        )
    else:
        from vfops._examples import example_environment

        with _example_copy(example_environment(example)) as copy:
            result = publish_environment(copy)
    if result.status == "unchanged":
        print(
            f"{result.env_name}@{result.version} already has this content "
            f"({result.content_hash[:12]}); nothing published"
        )
        return
    splits = ", ".join(f"{s}: {d['rows']} rows" for s, d in result.datasets.items()) or "none"
    print(
        f"published {result.env_name}@{result.version} (content {result.content_hash[:12]}, "
        f"code {result.code_hash[:12]}; datasets {splits})"
    )


@app.command("gc")
def gc_command(
    grace_hours: Annotated[
        float,
        typer.Option(help="Keep unreferenced objects younger than this (a publish in flight)."),
    ] = DEFAULT_GC_GRACE_HOURS,
    dry_run: Annotated[
        bool, typer.Option(help="List what would be removed; remove nothing.")
    ] = False,
    include_legacy: Annotated[
        bool,
        typer.Option(help="Also sweep <store>/sha256/ (versions published before environments/)."),
    ] = False,
) -> None:
    """Remove published artifacts that no registry row refers to (e.g. of a lost publish)."""
    from vfops.publishing import collect_garbage

    report = collect_garbage(
        grace_hours=grace_hours, dry_run=dry_run, include_legacy=include_legacy
    )
    verb = "would remove" if dry_run else "removed"
    for obj in report.removed:
        print(f"{verb} {obj.uri} ({obj.size} bytes, written {obj.modified:%Y-%m-%d %H:%M} UTC)")
    print(
        f"{verb} {len(report.removed)} unreferenced object(s), {report.removed_bytes} bytes; "
        f"kept {report.kept} referenced and {report.young} younger than {grace_hours:g} h"
    )


@app.command("list")
def list_command() -> None:
    """List published environments (registry) and installed ones (this Python)."""

    from vfops.envs import installed_environments
    from vfops.registry import get_engine, list_environments, list_versions, session_scope

    installed = installed_environments()
    table = Table("name", "library", "latest published", "versions", "installed")
    names: set[str] = set(installed)
    published: dict[str, list[str]] = {}
    with session_scope(get_engine(), write=False) as session:
        for env in list_environments(session):
            published[env.name] = [v.version for v in list_versions(session, env.name)]
            names.add(env.name)
    for name in sorted(names):
        versions = published.get(name, [])
        entry = installed.get(name)
        table.add_row(
            name,
            entry.library if entry is not None else "-",
            versions[0] if versions else "-",
            str(len(versions)),
            (entry.version or "-") if entry is not None else "-",
        )
    Console().print(table)


@app.command("show")
def show_command(
    ref: Annotated[str, typer.Argument(help="NAME or NAME@VERSION.")],
) -> None:
    """Details of a published version: hashes, artifacts, datasets, dependencies."""
    from vfops.publishing import find_published, parse_ref
    from vfops.registry import get_engine, session_scope

    name, version = parse_ref(ref)
    with session_scope(get_engine(), write=False) as session:
        row = find_published(session, name, version)
        table = Table("field", "value", title=f"{name}@{row.version}")
        table.add_row("content hash", row.content_hash)
        table.add_row("code hash", row.code_hash)
        table.add_row("wheel", f"{row.wheel_uri}\nsha256 {row.wheel_sha256}")
        table.add_row("sdist", f"{row.sdist_uri}\nsha256 {row.sdist_sha256}")
        for split, info in sorted(row.datasets.items()):
            table.add_row(f"dataset {split}", f"{info['rows']} rows, sha256 {info['sha256']}")
        table.add_row("dependencies", ", ".join(row.dependencies) or "-")
        table.add_row("description", row.description or "-")
        table.add_row("published", row.created_at.isoformat())
    Console().print(table)
