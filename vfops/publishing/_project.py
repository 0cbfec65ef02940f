"""Reading (and bumping) an environment package's ``pyproject.toml``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from vfops._config import read_toml
from vfops._errors import VfopsError
from vfops.envs import EnvironmentPackage, SourceReader, library_of

ENTRY_POINT_GROUP = "vfops.environments"
Bump = Literal["patch", "minor", "major"]


@dataclass(frozen=True)
class EnvironmentProject:
    """What publishing needs to know about an environment package."""

    path: Path
    distribution: str
    env_name: str
    entry_point: str  # "module:function", or "module" where the library reads the module
    version: str
    """Canonical (``0.1.00`` in the file is ``0.1.0`` here): what is compared and stored."""
    description: str | None
    readme: str | None
    dependencies: list[str]
    library: str = "vfops"
    """The environment library that claims it (``vfops``: a ``vfops.environments``
    entry point; ``verifiers``...: see :mod:`vfops.envs` ``_library``)."""
    declared_version: str = ""
    """The version as ``pyproject.toml`` spells it (for messages)."""

    @property
    def top_level_module(self) -> str:
        return self.entry_point.split(":", 1)[0].split(".", 1)[0]


def read_project(path: Path) -> EnvironmentProject:
    pyproject = path / "pyproject.toml"
    if not pyproject.is_file():
        raise VfopsError(
            f"{path} is not an environment package (no pyproject.toml); "
            "create one with: vfops env init NAME"
        )
    data = read_toml(pyproject)  # one line on non-UTF-8 or invalid TOML
    project = data.get("project") or {}
    dependencies = [str(d) for d in project.get("dependencies") or []]
    library, entry_points = _claimed(_package(data, path, dependencies))
    if len(entry_points) != 1:
        raise VfopsError(
            f"{pyproject} must declare exactly one entry point in "
            f'[project.entry-points."{ENTRY_POINT_GROUP}"], found {len(entry_points)} '
            "(an environment of another library follows its convention: a verifiers "
            "one depends on verifiers and has one module; a verifiers v1 taskset's module, "
            "named like the package, imports verifiers and exports its Taskset in __all__)"
        )
    ((env_name, entry_point),) = entry_points.items()
    declared_version = str(project.get("version") or "")
    version = ".".join(str(part) for part in parse_semver(declared_version, where=str(pyproject)))
    readme_name = project.get("readme")
    readme_path = path / readme_name if isinstance(readme_name, str) else path / "README.md"
    return EnvironmentProject(
        path=path,
        distribution=str(project.get("name") or env_name),
        env_name=env_name,
        entry_point=str(entry_point),
        version=version,
        description=project.get("description"),
        readme=_read_text(readme_path) if readme_path.is_file() else None,
        dependencies=dependencies,
        library=library,
        declared_version=declared_version,
    )


def _package(pyproject: dict[str, Any], path: Path, dependencies: list[str]) -> EnvironmentPackage:
    """What the source folder's ``pyproject.toml`` says about the package, for the
    environment libraries to claim it."""
    project = pyproject.get("project") or {}
    groups = {
        str(group): {str(name): str(value) for name, value in (eps or {}).items()}
        for group, eps in (project.get("entry-points") or {}).items()
        if isinstance(eps, dict)
    }
    return EnvironmentPackage(
        distribution=str(project.get("name") or path.name),
        requires=tuple(dependencies),
        entry_points=groups,
        modules=_declared_modules(pyproject),
        read_source=_folder_source(path),
    )


def _folder_source(path: Path) -> SourceReader:
    """Reads a source folder's importable files, from ``src/`` when it has one (where
    publishing imports them from too)."""
    roots = [path / "src", path] if (path / "src").is_dir() else [path]

    def read(relpath: str) -> bytes | None:
        for root in roots:
            try:
                return (root / relpath).read_bytes()
            except OSError:  # not there (or not a file): the next root
                continue
        return None

    return read


def _declared_modules(pyproject: dict[str, Any]) -> tuple[str, ...]:
    """The modules ``[tool.setuptools]`` lists: its one ``py-modules`` or ``packages``
    entry when either lists exactly one, else all it lists."""
    setuptools = (pyproject.get("tool") or {}).get("setuptools") or {}
    listed = [setuptools.get(key) for key in ("py-modules", "packages")]
    lists = [[str(m) for m in found] for found in listed if isinstance(found, list)]
    for modules in lists:
        if len(modules) == 1:
            return (modules[0],)
    return tuple(m for modules in lists for m in modules)


def _claimed(package: EnvironmentPackage) -> tuple[str, dict[str, str]]:
    """The library that claims ``package`` and its environments (none: vfops's own,
    with none, which the caller reports)."""
    claimed = library_of(package)
    if claimed is None:
        return "vfops", {}
    library, environments = claimed
    return library.name, environments


def parse_semver(version: str, *, where: str = "version") -> tuple[int, int, int]:
    """(major, minor, patch) of a MAJOR.MINOR.PATCH version, read as PEP 440 (``0.1.00``
    is 0.1.0: one version, however it is spelled); one line naming ``where`` if not."""
    from vfops.registry import parse_version  # the registry's own rule

    try:
        return parse_version(version, fix='set e.g. version = "0.1.0"')
    except VfopsError as exc:
        raise VfopsError(f"{where}: {exc}") from None


def bumped(version: str, bump: Bump) -> str:
    major, minor, patch = parse_semver(version)
    if bump == "major":
        return f"{major + 1}.0.0"
    if bump == "minor":
        return f"{major}.{minor + 1}.0"
    return f"{major}.{minor}.{patch + 1}"


def write_version(path: Path, version: str) -> None:
    """Set ``version`` in the ``[project]`` table of ``pyproject.toml``."""
    pyproject = path / "pyproject.toml"
    text = _read_text(pyproject)
    project_start = re.search(r"(?m)^\[project\]\s*$", text)
    if project_start is None:
        raise VfopsError(f"{pyproject} has no [project] table")
    next_table = re.search(r"(?m)^\[", text[project_start.end() :])
    end = project_start.end() + (
        next_table.start() if next_table else len(text) - project_start.end()
    )
    section = text[project_start.end() : end]
    new_section, count = re.subn(
        r'(?m)^version\s*=\s*["\'][^"\']*["\']', f'version = "{version}"', section, count=1
    )
    if count != 1:
        raise VfopsError(f'{pyproject} has no version = "..." line in [project]')
    pyproject.write_text(text[: project_start.end()] + new_section + text[end:], encoding="utf-8")


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise VfopsError(
            f"{path}: not UTF-8 text (byte offset {exc.start}); save it as UTF-8"
        ) from None
