"""Reading (and bumping) an environment package's ``pyproject.toml``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from vfops._config import read_toml
from vfops._errors import VfopsError

ENTRY_POINT_GROUP = "vfops.environments"
VERIFIERS_FACTORY = "load_environment"
"""A ``verifiers`` environment package's entry: ``<module>:load_environment``, where the
module is named after the environment (``verifiers``' convention; no entry point)."""
Bump = Literal["patch", "minor", "major"]
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class EnvironmentProject:
    """What publishing needs to know about an environment package."""

    path: Path
    distribution: str
    env_name: str
    entry_point: str  # "module:function"
    version: str
    """Canonical (``0.1.00`` in the file is ``0.1.0`` here): what is compared and stored."""
    description: str | None
    readme: str | None
    dependencies: list[str]
    library: str = "vfops"
    """``vfops`` (a ``vfops.environments`` entry point) or ``verifiers``."""
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
    entry_points = (project.get("entry-points") or {}).get(ENTRY_POINT_GROUP) or {}
    dependencies = [str(d) for d in project.get("dependencies") or []]
    library = "vfops"
    if not entry_points and requires_verifiers(dependencies):
        library = "verifiers"
        module = verifiers_module(data, str(project.get("name") or path.name))
        entry_points = {module: f"{module}:{VERIFIERS_FACTORY}"}
    if len(entry_points) != 1:
        raise VfopsError(
            f"{pyproject} must declare exactly one entry point in "
            f'[project.entry-points."{ENTRY_POINT_GROUP}"], found {len(entry_points)} '
            "(a verifiers environment instead depends on verifiers and has one module)"
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


def requires_verifiers(requirements: list[str]) -> bool:
    """Whether ``requirements`` (PEP 508 strings) name ``verifiers`` unconditionally."""
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        if "extra" in marker:
            continue
        match = _REQUIREMENT_NAME.match(spec)
        if match and match.group(1).lower().replace("_", "-") == "verifiers":
            return True
    return False


def verifiers_module(pyproject: dict[str, Any], distribution: str) -> str:
    """The module of a ``verifiers`` environment package: its one ``py-modules`` or
    ``packages`` entry, else ``verifiers``' convention (the name with ``_`` for ``-``)."""
    setuptools = (pyproject.get("tool") or {}).get("setuptools") or {}
    for key in ("py-modules", "packages"):
        listed = setuptools.get(key)
        if isinstance(listed, list) and len(listed) == 1:
            return str(listed[0])
    return distribution.replace("-", "_").replace(".", "_")


def parse_semver(version: str, *, where: str = "version") -> tuple[int, int, int]:
    """(major, minor, patch) of a MAJOR.MINOR.PATCH version, read as PEP 440 (``0.1.00``
    is 0.1.0: one version, however it is spelled); one line naming ``where`` if not."""
    from vfops.registry._environments import parse_version  # the registry's own rule

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
