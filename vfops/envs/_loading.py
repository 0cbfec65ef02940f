"""Resolve installed environment packages: vfops's by entry point, ``verifiers``' by name.

A vfops environment package declares, in its pyproject::

    [project.entry-points."vfops.environments"]
    my_env = "my_env:load_environment"

A ``verifiers`` environment package (``import verifiers as vf``) declares no entry
point: by that library's convention its module is named after the environment
(``vf-eval my-env`` imports ``my_env``) and exposes ``load_environment(**kwargs)``
returning a ``vf.Environment``. Such a package is any installed distribution that
requires ``verifiers``; it is run through :mod:`vfops.adapters` (the
``[verifiers]`` extra). Finding one reads package metadata only, and only when
``verifiers`` itself is installed, so a vfops-only install pays nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import (
    Distribution,
    PackageNotFoundError,
    distribution,
    distributions,
    entry_points,
)
from typing import Any, Literal

from vfops._errors import EnvironmentNotFoundError, VfopsError
from vfops.envs._environment import Environment
from vfops.envs._load_errors import load_failure

ENTRY_POINT_GROUP = "vfops.environments"

Library = Literal["vfops", "verifiers"]
"""Which library an environment package is written against."""

_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class EnvironmentEntry:
    """An installed environment: its name, where its ``load_environment`` lives, the
    library it targets and the distribution that installed it."""

    name: str
    module: str
    attr: str
    library: Library
    dist: Distribution | None

    def load(self) -> Callable[..., Any]:
        """Import the module and return its ``load_environment``."""
        factory: Callable[..., Any] = getattr(importlib.import_module(self.module), self.attr)
        return factory

    @property
    def version(self) -> str | None:
        return self.dist.version if self.dist is not None else None


def installed_environments() -> dict[str, EnvironmentEntry]:
    """Installed environments by name: vfops entry points, then ``verifiers`` packages
    (a vfops entry point wins a name both claim)."""
    found = {entry.name: entry for entry in verifiers_environments()}
    found.update(_vfops_environments())
    return found


def _vfops_environments() -> dict[str, EnvironmentEntry]:
    return {
        ep.name: EnvironmentEntry(
            ep.name, ep.module, ep.attr or "load_environment", "vfops", ep.dist
        )
        for ep in entry_points(group=ENTRY_POINT_GROUP)
    }


def verifiers_environments() -> list[EnvironmentEntry]:
    """Installed ``verifiers`` environment packages (none unless ``verifiers`` is)."""
    if importlib.util.find_spec("verifiers") is None:
        return []
    found: list[EnvironmentEntry] = []
    for dist in distributions():
        entry = _verifiers_entry(dist)
        if entry is not None:
            found.append(entry)
    return found


def _verifiers_entry(dist: Distribution) -> EnvironmentEntry | None:
    """``dist`` as a ``verifiers`` environment package, or None if it is not one."""
    name = _dist_name(dist)
    if name in {"verifiers", "vfops"} or not _requires_verifiers(dist):
        return None
    if any(ep.group == ENTRY_POINT_GROUP for ep in dist.entry_points):
        return None  # a vfops environment that also uses verifiers' helpers
    module = _module_of(dist, name.replace("-", "_"))
    return EnvironmentEntry(module, module, "load_environment", "verifiers", dist)


def _module_of(dist: Distribution, guess: str) -> str:
    """The environment's module: the one top-level module the distribution installs
    (``top_level.txt``), else verifiers' convention (the name with ``_`` for ``-``)."""
    listed = [line.strip() for line in (dist.read_text("top_level.txt") or "").splitlines()]
    modules = [line for line in listed if line and not line.startswith("_")]
    if guess in modules or len(modules) != 1:
        return guess
    return modules[0]


def _dist_name(dist: Distribution) -> str:
    return str(dist.metadata["Name"] or "").strip().lower().replace("_", "-").replace(".", "-")


def _requires_verifiers(dist: Distribution) -> bool:
    for requirement in dist.requires or ():
        name, _, marker = requirement.partition(";")
        if "extra" in marker:  # an optional dependency does not make it an environment
            continue
        match = _REQUIREMENT_NAME.match(name)
        if match and match.group(1).lower().replace("_", "-") == "verifiers":
            return True
    return False


def find_environment(name: str) -> EnvironmentEntry | None:
    """The installed environment ``name`` (``-`` and ``_`` are the same), or None.

    Cheap for the usual case: vfops's entry points, then the distribution named like
    the environment; all packages' metadata is read (~0.2 s) only when both miss.
    """
    vfops_envs = _vfops_environments()
    found = vfops_envs.get(name) or vfops_envs.get(_normalise(name))
    if found is not None or importlib.util.find_spec("verifiers") is None:
        return found
    for candidate in dict.fromkeys((name, name.replace("_", "-"), name.replace("-", "_"))):
        try:
            dist = distribution(candidate)
        except PackageNotFoundError:
            continue
        entry = _verifiers_entry(dist)
        if entry is not None and entry.name in (name, _normalise(name)):
            return entry
    available = {entry.name: entry for entry in verifiers_environments()}
    return available.get(name) or available.get(_normalise(name))


def environment_version(name: str) -> str | None:
    """The installed distribution version of environment ``name``, if known."""
    entry = find_environment(name)
    return entry.version if entry is not None else None


def load_environment(name: str, /, **env_args: Any) -> Environment:
    """Build the environment ``name`` with ``load_environment(**env_args)`` of its package;
    a ``verifiers`` environment comes wrapped in :class:`vfops.adapters.VerifiersEnvironment`.

    ``name`` is positional-only: every keyword is an environment argument, one called
    ``name`` included (``-a '{"name": "x"}'`` reaches a loader that takes ``name``).
    """
    entry = find_environment(name)
    if entry is None:
        listing = ", ".join(sorted(installed_environments())) or "none"
        raise EnvironmentNotFoundError(
            f"unknown environment '{name}' (installed: {listing}); "
            f"install it with: vfops env install PATH"
        )
    if entry.library == "verifiers":
        from vfops.adapters import load_verifiers_environment

        return load_verifiers_environment(entry, **env_args)
    try:
        factory = entry.load()
    except Exception as exc:
        raise load_failure(
            f"environment '{name}' failed to import:",
            exc,
            otherwise="fix the package or reinstall it with: vfops env install PATH",
        ) from exc
    try:
        env = factory(**env_args)
    except VfopsError:
        raise  # already one line with its fix (a dataset row without a prompt...)
    except Exception as exc:
        raise load_failure(
            f"load_environment of '{name}' raised", exc, factory=factory, env_args=env_args
        ) from exc
    if not isinstance(env, Environment):
        raise VfopsError(
            f"load_environment of '{name}' returned {type(env).__name__}, not an Environment"
        )
    if env.name == type(env).__name__:
        env.name = entry.name
    return env


def _normalise(name: str) -> str:
    return name.replace("-", "_")
