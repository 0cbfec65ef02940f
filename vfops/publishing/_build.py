"""Building an environment package and snapshotting its datasets."""

from __future__ import annotations

import contextlib
import importlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vfops._errors import VfopsError
from vfops.envs._dataset import quiet_datasets
from vfops.publishing._hashing import file_sha256
from vfops.publishing._project import EnvironmentProject


@dataclass(frozen=True)
class BuiltDistributions:
    wheel: Path
    sdist: Path


def build_distributions(project: EnvironmentProject, out_dir: Path) -> BuiltDistributions:
    """Build the sdist, then the wheel from it, with the standard ``build`` frontend."""
    command = [sys.executable, "-m", "build", "--outdir", str(out_dir), str(project.path)]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
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


@dataclass(frozen=True)
class DatasetSnapshot:
    split: str
    path: Path
    sha256: str
    rows: int


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


def load_from_source(project: EnvironmentProject) -> Any:
    """Call the package's ``load_environment()`` from its source folder (not installed)."""
    module_name, _, attr = project.entry_point.partition(":")
    with _source_on_path(project.path, project.top_level_module):
        try:
            module = importlib.import_module(module_name)
            factory = getattr(module, attr or "load_environment")
            if project.library == "verifiers":  # its splits, as verifiers formats them
                from vfops.adapters import build_verifiers_environment

                env = build_verifiers_environment(factory, project.env_name)
                env.splits()  # built while its source is the one imported
            else:
                with quiet_datasets():  # environments build their datasets with Dataset.map
                    env = factory()
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
