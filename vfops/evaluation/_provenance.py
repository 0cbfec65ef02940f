"""Which code a run ran (a published version or ``local+<hash>``) and the run's
configuration fingerprint (what makes two runs the same run)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vfops.evaluation._runner import EvalRequest

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from vfops.publishing import InstalledEnvironment


@dataclass(frozen=True)
class Provenance:
    """Exactly which code ran: a published version, or ``local+<hash>``."""

    env_name: str
    version: str
    code_hash: str
    version_id: int | None
    library: str = "vfops"
    library_version: str | None = None

    @property
    def published(self) -> bool:
        return self.version_id is not None

    @property
    def library_label(self) -> str | None:
        """``verifiers==0.3.1`` for an environment written for another library (it is
        part of what ran); None for a vfops environment."""
        if self.library == "vfops":
            return None
        return f"{self.library}=={self.library_version or 'unknown'}"


def resolve_provenance(
    engine: Engine, env_name: str, installed: InstalledEnvironment | None = None
) -> Provenance:
    """Match the installed code of ``env_name`` (``installed``: already inspected, by the
    evaluating process, which knows its environments) against the published versions."""

    from vfops.publishing import inspect_installed
    from vfops.registry import find_version, session_scope

    installed = installed or inspect_installed(env_name)
    with session_scope(engine, write=False) as session:
        row = find_version(session, installed.env_name, code_hash=installed.code_hash)
        version_id = row.id if row is not None else None
        version = row.version if row is not None else installed.local_label
    return Provenance(
        installed.env_name,
        version,
        installed.code_hash,
        version_id,
        library=installed.library,
        library_version=installed.library_version,
    )


def config_fingerprint(request: EvalRequest, provenance: Provenance) -> str:
    """Hash of everything that changes what a run produces (the registry's
    :func:`vfops.registry.run_fingerprint`, which opening a run computes)."""
    from vfops.registry import InstalledCode, run_fingerprint

    code = InstalledCode(
        provenance.env_name,
        provenance.code_hash,
        f"local+{provenance.code_hash[:12]}",
        provenance.library,
        provenance.library_version,
    )
    identity = {**request.identity(), "base_url": request.base_url}
    return run_fingerprint(identity, provenance.version, code)
