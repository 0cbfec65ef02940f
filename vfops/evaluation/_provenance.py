"""Which code a run ran (a published version or ``local+<hash>``) and the run's
configuration fingerprint (what makes two runs the same run)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from vfops.evaluation._runner import EvalRequest

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from vfops.publishing._provenance import InstalledEnvironment


@dataclass(frozen=True)
class Provenance:
    """Exactly which code ran: a published version, or ``local+<hash>``."""

    env_name: str
    version: str
    code_hash: str
    version_id: int | None

    @property
    def published(self) -> bool:
        return self.version_id is not None


def resolve_provenance(
    engine: Engine, env_name: str, installed: InstalledEnvironment | None = None
) -> Provenance:
    """Match the installed code of ``env_name`` (``installed``: already inspected, by the
    evaluating process, which knows its environments) against the published versions."""
    from sqlalchemy.orm import Session

    from vfops.publishing._provenance import inspect_installed
    from vfops.registry import find_version

    installed = installed or inspect_installed(env_name)
    with Session(engine) as session:
        row = find_version(session, installed.env_name, code_hash=installed.code_hash)
        if row is not None:
            return Provenance(installed.env_name, row.version, installed.code_hash, row.id)
    return Provenance(installed.env_name, installed.local_label, installed.code_hash, None)


def config_fingerprint(request: EvalRequest, provenance: Provenance) -> str:
    """Hash of everything that changes what a run produces."""
    identity = {
        **request.identity(),
        "base_url": request.base_url,
        "env_version": provenance.version,
        "code_hash": provenance.code_hash,
    }
    return hashlib.sha256(orjson.dumps(identity, option=orjson.OPT_SORT_KEYS)).hexdigest()
