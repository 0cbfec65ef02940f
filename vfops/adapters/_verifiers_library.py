"""``verifiers`` as an environment library of vfops (registered as
``verifiers = "vfops.adapters:VERIFIERS"`` in ``vfops.environment_libraries``).

A ``verifiers`` environment package declares no entry point: by that library's
convention its module is named after the environment (``vf-eval my-env`` imports
``my_env``) and exposes ``load_environment(**kwargs)`` returning a ``vf.Environment``.
Such a package is one that requires ``verifiers`` (not only for an extra) and
declares no ``vfops.environments`` entry point (that would make it a vfops
environment that uses ``verifiers``' helpers). Finding one reads package metadata
only, and only when ``verifiers`` itself is installed, so a vfops-only install pays
nothing; this module imports no ``verifiers`` (``_verifiers`` does, seconds, on load).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, distribution
from typing import Any

from vfops.adapters._verifiers_line import NATIVE_GROUP, dependents, installed_line, module_of
from vfops.envs import (
    Environment,
    EnvironmentEntry,
    EnvironmentLibrary,
    EnvironmentPackage,
)

_NOT_ENVIRONMENTS = frozenset({"verifiers", "vfops"})
"""Distributions that require ``verifiers`` (or provide it) but hold no environment."""


class VerifiersLibrary(EnvironmentLibrary):
    """Environments written for ``verifiers`` (the 0.3 line's classic API)."""

    name = "verifiers"

    def environments(self, package: EnvironmentPackage) -> dict[str, str]:
        if not package.depends_on("verifiers") or package.entry_points.get(NATIVE_GROUP):
            return {}
        if installed_line() == "v1":  # its packages are v1 tasksets (vfops.adapters._v1_library)
            return {}
        module = module_of(package)
        return {module: f"{module}:load_environment"}

    def installed(self) -> list[EnvironmentEntry]:
        if not _classic_installed():
            return []
        found: list[EnvironmentEntry] = []
        for package in dependents():
            found.extend(self._installed_entries(package))
        return found

    def find(self, name: str) -> EnvironmentEntry | None:
        """Cheap for the usual case: the distribution named like the environment; every
        package's metadata is read (~0.2 s) only when it misses."""
        if not _classic_installed():
            return None
        wanted = (name, name.replace("-", "_"))
        for candidate in dict.fromkeys((name, name.replace("_", "-"), name.replace("-", "_"))):
            try:
                dist = distribution(candidate)
            except PackageNotFoundError:
                continue
            for entry in self._installed_entries(EnvironmentPackage.from_distribution(dist)):
                if entry.name in wanted:
                    return entry
        return super().find(name)

    def _installed_entries(self, package: EnvironmentPackage) -> list[EnvironmentEntry]:
        if package.distribution in _NOT_ENVIRONMENTS:
            return []
        return self.entries(package)

    def load(self, entry: EnvironmentEntry, /, **env_args: Any) -> Environment:
        from vfops.adapters._verifiers import load_verifiers_environment

        return load_verifiers_environment(entry, **env_args)

    def build(self, factory: Callable[..., Any], name: str, /, **env_args: Any) -> Environment:
        from vfops.adapters._verifiers import build_verifiers_environment

        return build_verifiers_environment(factory, name, **env_args)


def _classic_installed() -> bool:
    """Whether a ``verifiers`` other than the v1-only line (0.4 on) is installed: with 0.4
    installed, its packages are v1 tasksets, found by :mod:`vfops.adapters._v1_library`."""
    return importlib.util.find_spec("verifiers") is not None and installed_line() != "v1"


VERIFIERS = VerifiersLibrary()
