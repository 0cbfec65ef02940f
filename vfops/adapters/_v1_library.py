"""Tasksets written for today's ``verifiers`` (0.4 on: only ``verifiers.v1``) as an
environment library of vfops, registered as ``verifiers-v1 = "vfops.adapters:VERIFIERS_V1"``
in ``vfops.environment_libraries``.

A v1 taskset package declares no entry point either: ``vf-eval <taskset-id>`` imports the
module named like the id and takes the ``Taskset`` subclass its ``__all__`` exports. Which
packages hold one is decided, without importing them, by the rule of
:mod:`vfops.adapters._v1_packages` (a package that requires ``verifiers``, or one whose
module named like it imports ``verifiers``, as upstream's reverse_text does while declaring
only ``datasets``): ``vfops env list`` lists those, ``vfops env publish`` publishes them,
and ``vfops eval`` finds them by it first, then takes any other importable module named
like the id, as ``vf-eval`` does (loading it confirms it is a taskset, in one line). Only
while verifiers 0.4 or later is installed: with the classic line installed,
:mod:`vfops.adapters._verifiers_library` finds the packages instead. This module imports
no ``verifiers``; :mod:`vfops.adapters._v1` does, on load.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, distribution, version
from typing import Any

from vfops.adapters._v1_packages import installed_candidates, module_named_like, taskset_module
from vfops.adapters._verifiers_line import NATIVE_GROUP, installed_line
from vfops.envs import (
    Environment,
    EnvironmentEntry,
    EnvironmentLibrary,
    EnvironmentPackage,
)


class VerifiersV1Library(EnvironmentLibrary):
    """Tasksets written for ``verifiers.v1`` (verifiers 0.4 on), run by vfops in-process."""

    name = "verifiers-v1"

    def environments(self, package: EnvironmentPackage) -> dict[str, str]:
        if installed_line() != "v1":
            return {}
        module = taskset_module(package)
        # the module alone: its Taskset is the one its __all__ exports (verifiers' rule)
        return {module: module} if module is not None else {}

    def installed(self) -> list[EnvironmentEntry]:
        """Every installed package the rule claims (0.14 s for the v1 venv's ~290: most
        are settled by their metadata or one file)."""
        if installed_line() != "v1":
            return []
        return [entry for package in installed_candidates() for entry in self.entries(package)]

    def find(self, name: str) -> EnvironmentEntry | None:
        """The distribution named like the taskset when the rule claims it (as listed),
        else any importable module of that name (the way ``vf-eval <taskset-id>`` resolves
        an id; whether it holds a ``Taskset`` is checked when it is loaded, in one line)."""
        if installed_line() != "v1":
            return None
        module = module_named_like(name)
        for candidate in dict.fromkeys((name, name.replace("_", "-"), name.replace("-", "_"))):
            try:
                dist = distribution(candidate)
            except PackageNotFoundError:
                continue
            package = EnvironmentPackage.from_distribution(dist)
            if package.entry_points.get(NATIVE_GROUP):
                return None  # a vfops environment of that name
            claimed = self.entries(package)
            return claimed[0] if claimed else EnvironmentEntry(module, module, "", self.name, dist)
        if importlib.util.find_spec(module) is not None:
            return EnvironmentEntry(module, module, "", self.name, None)
        return None

    def load(self, entry: EnvironmentEntry, /, **env_args: Any) -> Environment:
        from vfops.adapters._v1 import load_taskset_environment

        return load_taskset_environment(entry.module, entry.name, **env_args)

    def build(self, factory: Callable[..., Any], name: str, /, **env_args: Any) -> Environment:
        """``factory`` is the taskset's module (the entry names no function)."""
        from vfops.adapters._v1 import load_taskset_environment

        module = getattr(factory, "__name__", None) or name
        return load_taskset_environment(str(module), name, **env_args)

    def version(self) -> str | None:
        try:
            return version("verifiers")
        except PackageNotFoundError:
            return None

    def entries(self, package: EnvironmentPackage) -> list[EnvironmentEntry]:
        return [
            EnvironmentEntry(name, module, "", self.name, package.dist)
            for name, module in self.environments(package).items()
        ]


VERIFIERS_V1 = VerifiersV1Library()
"""Tasksets written for ``verifiers.v1`` (verifiers 0.4 on), run by vfops."""
