"""Building an environment package and snapshotting its datasets.

The datasets are the environment's own formatted splits, built from the source folder
by the environment library that claims the package (``vfops.envs``' plug-in protocol:
vfops's own, the ``verifiers`` adapter, any other registered), so a published snapshot
is what an evaluation of that version reads."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vfops._errors import VfopsError
from vfops.envs import Environment, environment_library, quiet_datasets
from vfops.publishing._hashing import file_sha256
from vfops.publishing._project import EnvironmentProject


@dataclass(frozen=True)
class BuiltDistributions:
    wheel: Path
    sdist: Path


def build_distributions(project: EnvironmentProject, out_dir: Path) -> BuiltDistributions:
    """Build the sdist, then the wheel from it, with the standard ``build`` frontend.

    In this interpreter when it already has what the project's ``[build-system]``
    requires (``build`` checks the backend's own extra requirements too), else in
    build's isolated environments. Isolation installs the backend afresh for the sdist
    and again for the wheel: ~3 s of every publish on a 2-core machine, for the same
    backend the interpreter already has. The package's content hash covers its sources,
    so which of the two built it never changes its identity.
    """
    isolated = not _build_requirements_met(project.path)
    completed = _run_build(project.path, out_dir, isolated=isolated)
    if completed.returncode != 0 and not isolated and _missing_dependencies(completed):
        completed = _run_build(project.path, out_dir, isolated=True)
    if completed.returncode != 0:
        lines = [
            line
            for line in completed.stderr.splitlines() + completed.stdout.splitlines()
            if line.strip()
        ]
        errors = [line for line in lines if "error" in line.lower()]
        reason = (errors or lines or ["build failed"])[-1].strip()
        raise VfopsError(f"building {project.path} failed: {reason}")
    wheels = sorted(out_dir.glob("*.whl"))
    sdists = sorted(out_dir.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise VfopsError(f"building {project.path} produced {wheels + sdists}, expected one each")
    return BuiltDistributions(wheel=wheels[0], sdist=sdists[0])


def _run_build(path: Path, out_dir: Path, *, isolated: bool) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "build", "--outdir", str(out_dir), str(path)]
    if not isolated:
        command.append("--no-isolation")
    return subprocess.run(command, capture_output=True, text=True, check=False)


def _missing_dependencies(completed: subprocess.CompletedProcess[str]) -> bool:
    """Whether build refused for want of a build requirement (``Unmet dependencies``
    since build 1.3, ``Missing dependencies`` before)."""
    output = completed.stdout + completed.stderr
    return "Unmet dependencies" in output or "Missing dependencies" in output


# PEP 518: a project without [build-system].requires builds with setuptools
_DEFAULT_BUILD_REQUIRES = ("setuptools>=40.8.0",)


def _build_requirements_met(path: Path) -> bool:
    """Whether this interpreter has every distribution ``path``'s build system requires."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        with (path / "pyproject.toml").open("rb") as file:
            build_system = tomllib.load(file).get("build-system", {})
        requires = build_system.get("requires", list(_DEFAULT_BUILD_REQUIRES))
        wanted = [Requirement(str(text)) for text in requires]
    except (OSError, tomllib.TOMLDecodeError, InvalidRequirement, AttributeError):
        return False  # the isolated build reports what is wrong with it
    for requirement in wanted:
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            return False
        if not requirement.specifier.contains(installed, prereleases=True):
            return False
    return True


@dataclass(frozen=True)
class DatasetSnapshot:
    split: str
    path: Path
    sha256: str
    rows: int


SNAPSHOT_ROWS = 100
"""Rows of an environment without an end (an infinite taskset) that a published
version's dataset snapshot holds: its first ones, as ``-n`` would run them."""


def snapshot_datasets(project: EnvironmentProject, out_dir: Path) -> list[DatasetSnapshot]:
    """Load the environment from source and write each formatted split as parquet."""
    env = load_from_source(project)
    snapshots = []
    for split, dataset in env.splits().items():
        path = out_dir / f"{project.env_name}-{split}.parquet"
        with quiet_datasets():
            dataset.to_parquet(str(path))
        snapshots.append(
            DatasetSnapshot(split=split, path=path, sha256=file_sha256(path), rows=len(dataset))
        )
    return snapshots


def load_from_source(project: EnvironmentProject) -> Environment:
    """Build the environment from its source folder (not installed), with its default
    arguments, through the library it is written against (``project.library``)."""
    library = environment_library(project.library)
    module_name, _, attr = project.entry_point.partition(":")
    with _source_on_path(project.path, project.top_level_module):
        try:
            module = importlib.import_module(module_name)
            # "module" alone: the library finds what it needs in the module (verifiers
            # v1 takes the Taskset its __all__ exports)
            factory: Any = getattr(module, attr) if attr else module
            with quiet_datasets():  # environments build their datasets with Dataset.map
                env = library.build(factory, project.env_name)
                # an endless source (an infinite v1 taskset) builds, and so snapshots, its
                # first SNAPSHOT_ROWS rows; every other environment, all of its rows
                env.eval_size(SNAPSHOT_ROWS)
                env.splits()  # built while its source is the one imported
        except VfopsError as exc:
            raise VfopsError(
                f"{project.path}: {exc}; it must build with its default arguments to be published"
            ) from exc
        except Exception as exc:
            raise VfopsError(
                f"load_environment of {project.path} raised {type(exc).__name__}: {exc}; "
                "it must build with its default arguments to be published"
            ) from exc
    return env


@contextlib.contextmanager
def _source_on_path(path: Path, top_level: str) -> Iterator[None]:
    # Import the source tree, not an installed copy of the same name.
    saved = {
        name: mod
        for name, mod in sys.modules.items()
        if name == top_level or name.startswith(f"{top_level}.")
    }
    for name in saved:
        del sys.modules[name]
    roots = [str(path / "src"), str(path)] if (path / "src").is_dir() else [str(path)]
    sys.path[:0] = roots
    try:
        yield
    finally:
        for root in roots:
            sys.path.remove(root)
        for name in [n for n in sys.modules if n == top_level or n.startswith(f"{top_level}.")]:
            del sys.modules[name]
        sys.modules.update(saved)
