"""vfops's own environment library: packages that declare a ``vfops.environments`` entry
point whose ``load_environment`` returns a :class:`~vfops.envs.Environment`.

It registers like any other library (``vfops = "vfops.envs._native:LIBRARY"`` in
vfops's ``pyproject.toml``), so the loader treats it as one of many; it is also the
loader's fallback when vfops runs from a source tree whose metadata lacks that entry
point. A package declares, in its ``pyproject.toml``::

    [project.entry-points."vfops.environments"]
    my_env = "my_env:load_environment"
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from vfops._errors import VfopsError
from vfops.envs._environment import Environment
from vfops.envs._library import (
    DEFAULT_FACTORY,
    EnvironmentEntry,
    EnvironmentLibrary,
    EnvironmentPackage,
)
from vfops.envs._load_errors import load_failure

ENTRY_POINT_GROUP = "vfops.environments"


class VfopsLibrary(EnvironmentLibrary):
    """Environments written against ``vfops.envs``."""

    name = "vfops"

    def environments(self, package: EnvironmentPackage) -> dict[str, str]:
        return dict(package.entry_points.get(ENTRY_POINT_GROUP) or {})

    def installed(self) -> list[EnvironmentEntry]:
        # the entry points alone: no other metadata of any package is read
        return [
            EnvironmentEntry(ep.name, ep.module, ep.attr or DEFAULT_FACTORY, self.name, ep.dist)
            for ep in entry_points(group=ENTRY_POINT_GROUP)
        ]

    def build(self, factory: Callable[..., Any], name: str, /, **env_args: Any) -> Environment:
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
            env.name = name
        return env

    def version(self) -> str | None:
        return None  # vfops's own: a run of its environments records no library label


LIBRARY = VfopsLibrary()
