"""Which code ran: the installed environment's code hash, matched to a published version."""

from __future__ import annotations

from dataclasses import dataclass

from vfops._errors import EnvironmentNotFoundError
from vfops.envs import environment_library, find_environment, installed_environments
from vfops.publishing._hashing import installed_code_hash


@dataclass(frozen=True)
class InstalledEnvironment:
    """The installed code of an environment: name, its distribution's claim, its hash."""

    env_name: str
    distribution_version: str | None
    code_hash: str
    library: str = "vfops"
    """The environment library it is written against (``vfops``, ``verifiers``, ...)."""
    library_version: str | None = None
    """That library's installed version, when it is not vfops (it changes what runs)."""

    @property
    def local_label(self) -> str:
        """The version label of code that matches no published version."""
        return f"local+{self.code_hash[:12]}"


def inspect_installed(env_name: str) -> InstalledEnvironment:
    entry = find_environment(env_name)
    if entry is None:
        raise EnvironmentNotFoundError(
            f"unknown environment '{env_name}' "
            f"(installed: {', '.join(sorted(installed_environments())) or 'none'}); "
            "install it with: vfops env install PATH"
        )
    top_level = entry.module.split(".", 1)[0]
    return InstalledEnvironment(
        env_name=entry.name,
        distribution_version=entry.version,
        code_hash=installed_code_hash(top_level),
        library=entry.library,
        library_version=environment_library(entry.library).version(),
    )
