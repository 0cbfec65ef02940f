"""What a wheel says it is (file name, METADATA, entry point), checked against the registry.

A wheel whose name, version or environment entry point disagrees with the registry row it
is published or installed as would make provenance lie: ``env@1.2.0`` in the registry,
another version's code on disk. Publishing and installing both refuse it.
"""

from __future__ import annotations

import configparser
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    canonicalize_version,
    parse_wheel_filename,
)

from vfops._errors import VfopsError
from vfops.envs import EnvironmentPackage, SourceReader, library_of
from vfops.publishing._project import ENTRY_POINT_GROUP


@dataclass(frozen=True)
class WheelIdentity:
    """A wheel's distribution name and version, and the environments it holds (its
    ``vfops.environments`` entry points, or those another environment library finds)."""

    distribution: str
    version: str
    environments: dict[str, str]  # entry-point name -> "module:function"


def read_wheel_identity(wheel: Path) -> WheelIdentity:
    """Read and cross-check the file name, ``METADATA`` and ``entry_points.txt`` of ``wheel``.

    Raises :class:`VfopsError` (one line) when the file name is not a wheel name, the
    metadata is missing, or the file name and ``METADATA`` disagree.
    """
    try:
        file_name, file_version, _, _ = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        raise VfopsError(f"{wheel.name} is not a wheel file name ({exc}); rebuild it") from None
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            metadata_files = [
                n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
            ]
            if len(metadata_files) != 1:
                raise VfopsError(
                    f"{wheel.name} has {len(metadata_files)} .dist-info/METADATA files, "
                    "expected 1; rebuild it with python -m build"
                )
            dist_info = metadata_files[0].split("/", 1)[0]
            metadata = HeaderParser().parsestr(
                archive.read(metadata_files[0]).decode("utf-8", "replace")
            )
            entry_points_file = f"{dist_info}/entry_points.txt"
            entry_points_text = (
                archive.read(entry_points_file).decode("utf-8", "replace")
                if entry_points_file in names
                else ""
            )
    except zipfile.BadZipFile as exc:
        raise VfopsError(f"{wheel.name} is not a readable wheel ({exc}); rebuild it") from None
    meta_name, meta_version = metadata.get("Name"), metadata.get("Version")
    if not meta_name or not meta_version:
        raise VfopsError(
            f"{wheel.name}: METADATA has no Name or Version; rebuild it with python -m build"
        )
    if canonicalize_name(meta_name) != file_name or canonicalize_version(
        meta_version
    ) != canonicalize_version(file_version):
        raise VfopsError(
            f"{wheel.name} says {file_name} {file_version} in its file name but "
            f"{meta_name} {meta_version} in its METADATA; rebuild it with python -m build"
        )
    package = EnvironmentPackage(
        distribution=str(file_name),
        requires=tuple(metadata.get_all("Requires-Dist") or ()),
        entry_points=_entry_points(wheel, entry_points_text),
        modules=_top_level_modules(names),
        read_source=_wheel_source(wheel, names),
    )
    claimed = library_of(package)  # the environment library that claims the wheel
    environments = claimed[1] if claimed is not None else {}
    return WheelIdentity(
        distribution=str(file_name), version=str(meta_version), environments=environments
    )


def _wheel_source(wheel: Path, names: list[str]) -> SourceReader:
    """Reads the wheel's files (for a library that reads a package's source to claim it)."""
    present = set(names)

    def read(relpath: str) -> bytes | None:
        if relpath not in present:
            return None
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(relpath)

    return read


def _top_level_modules(names: list[str]) -> tuple[str, ...]:
    """The top-level modules and packages the wheel installs (for a library whose
    environment is the package's one module, as ``verifiers``')."""
    tops: set[str] = set()
    for name in names:
        head, _, rest = name.partition("/")
        if head.endswith((".dist-info", ".data")):
            continue
        if not rest and head.endswith(".py"):
            tops.add(head.removesuffix(".py"))
        elif rest == "__init__.py":
            tops.add(head)
    return tuple(sorted(tops))


def _entry_points(wheel: Path, text: str) -> dict[str, dict[str, str]]:
    """``entry_points.txt``: group -> name -> ``module:function``."""
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # names are case-sensitive
    try:
        parser.read_string(text)
    except configparser.Error as exc:
        reason = str(exc).splitlines()[0]
        raise VfopsError(
            f"{wheel.name}: unreadable entry_points.txt ({reason}); rebuild it"
        ) from None
    return {
        group: {name: value.strip() for name, value in parser.items(group)}
        for group in parser.sections()
    }


def check_wheel_identity(
    wheel: Path,
    *,
    env_name: str,
    version: str,
    entry_point: str | None = None,
    distribution: str | None = None,
) -> WheelIdentity:
    """Refuse ``wheel`` unless it is ``version`` and declares environment ``env_name``.

    ``entry_point`` (``module:function``) and ``distribution`` are checked too when given
    (at publish, from ``pyproject.toml``); at install the registry row has neither.
    """
    found = read_wheel_identity(wheel)
    row = f"{env_name}@{version}"
    shown = f"{found.distribution} {found.version}"
    if canonicalize_version(found.version) != canonicalize_version(version):
        raise VfopsError(
            f"{wheel.name} is version {found.version} but is registered as {row}; "
            "the wheel and the registry row disagree: re-publish the environment"
        )
    if distribution is not None and canonicalize_name(distribution) != found.distribution:
        raise VfopsError(
            f"{wheel.name} is distribution {found.distribution} but the project is "
            f"{distribution} ({row}); rebuild it from the project folder"
        )
    declared = ", ".join(sorted(found.environments)) or "none"
    if env_name not in found.environments:
        raise VfopsError(
            f"{wheel.name} ({shown}) declares the environment {declared} in "
            f"[{ENTRY_POINT_GROUP}], not {env_name!r} of {row}; "
            "the wheel and the registry row disagree: re-publish the environment"
        )
    if entry_point is not None and found.environments[env_name] != entry_point:
        raise VfopsError(
            f"{wheel.name} ({shown}) points {env_name} at {found.environments[env_name]!r}, "
            f"but the project declares {entry_point!r} for {row}; rebuild it"
        )
    return found
