"""Resolve installed environment packages through entry points.

An environment package declares, in its pyproject::

    [project.entry-points."vfops.environments"]
    my_env = "my_env:load_environment"
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any

from vfops._errors import EnvironmentNotFoundError, VfopsError
from vfops.envs._environment import Environment

ENTRY_POINT_GROUP = "vfops.environments"


def installed_environments() -> dict[str, EntryPoint]:
    """Installed environments by name."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def environment_version(name: str) -> str | None:
    """The installed distribution version of environment ``name``, if known."""
    entry = installed_environments().get(_normalise(name)) or installed_environments().get(name)
    if entry is None or entry.dist is None:
        return None
    return entry.dist.version


def load_environment(name: str, **kwargs: Any) -> Environment:
    """Build the environment ``name`` with ``load_environment(**kwargs)`` of its package."""
    available = installed_environments()
    entry = available.get(name) or available.get(_normalise(name))
    if entry is None:
        listing = ", ".join(sorted(available)) or "none"
        raise EnvironmentNotFoundError(
            f"unknown environment '{name}' (installed: {listing}); "
            f"install it with: vfops env install PATH"
        )
    try:
        factory = entry.load()
    except Exception as exc:
        raise VfopsError(
            f"environment '{name}' failed to import: {type(exc).__name__}: {exc}; "
            "fix the package or reinstall it with: vfops env install PATH"
        ) from exc
    try:
        env = factory(**kwargs)
    except Exception as exc:
        raise VfopsError(
            f"load_environment of '{name}' raised {type(exc).__name__}: {exc}; "
            "check --env-args against its load_environment signature"
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
