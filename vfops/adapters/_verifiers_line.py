"""What vfops's two ``verifiers`` libraries share, all read from package metadata (asking
imports no ``verifiers``, which takes seconds).

Which ``verifiers`` line is installed: its classic API (0.3) or only its v1 tasksets (0.4
on). The two cannot share a virtualenv (``[verifiers]`` pins <0.4, ``[verifiers-v1]``
>=0.4), so whichever is installed decides which of the two libraries finds packages. And
which installed packages are written for it: those that require ``verifiers``, named by
their one module."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from importlib.metadata import PackageNotFoundError, distributions, version
from typing import Literal

from vfops.envs import EnvironmentPackage, requires

Line = Literal["classic", "v1"]


def release(text: str) -> tuple[int, int, int]:
    """``0.4.0rc1`` -> ``(0, 4, 0)``: the numeric release, local and pre-release parts dropped."""
    parts: list[int] = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        parts.append(int(digits or 0))
    major, minor, patch = [*parts, 0, 0, 0][:3]
    return major, minor, patch


@cache
def installed_line() -> Line | None:
    """``"classic"`` for verifiers 0.3.x, ``"v1"`` for 0.4 and later, None when it is
    not installed (or older than either: 0.3.1 is the first classic release vfops runs)."""
    try:
        found = release(version("verifiers"))
    except PackageNotFoundError:
        return None
    if found >= (0, 4, 0):
        return "v1"
    if found >= (0, 3, 1):
        return "classic"
    return None


NATIVE_GROUP = "vfops.environments"
"""A package declaring vfops's entry point is a vfops environment that uses verifiers' helpers."""


def dependents() -> Iterator[EnvironmentPackage]:
    """The installed packages that require ``verifiers`` (outside an extra) and declare no
    vfops environment; the requirements are read first, which rejects most on their own."""
    for dist in distributions():
        if requires(dist.requires or (), "verifiers"):
            package = EnvironmentPackage.from_distribution(dist)
            if not package.entry_points.get(NATIVE_GROUP):
                yield package


def module_of(package: EnvironmentPackage) -> str:
    """A verifiers package's module: the one top-level module it installs, else the
    distribution name with ``_`` for ``-`` and ``.`` (verifiers' convention, as ``vf-eval
    my-env`` imports ``my_env``)."""
    if len(package.modules) == 1:
        return package.modules[0]
    return package.distribution.replace("-", "_").replace(".", "_")
