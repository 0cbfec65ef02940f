"""``vfops env gc``: remove published-artifact store objects no registry row refers to.

A publish uploads first and writes its registry row last, so an object younger than the
grace period may belong to a publish still in flight; only older ones are removed. A
publish that re-uses an existing object refreshes its write time, and re-uploads any
object that vanished before its row was written.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vfops._errors import VfopsError
from vfops.artifacts import DEFAULT_GC_GRACE_HOURS
from vfops.publishing._publish import artifact_keys, environment_store

if TYPE_CHECKING:
    from vfops.artifacts import ArtifactStore, StoredObject


@dataclass
class GcReport:
    """What a collection found: removed (or, dry run, to remove), kept, too young."""

    dry_run: bool
    grace_hours: float
    removed: list[StoredObject] = field(default_factory=list)
    kept: int = 0
    young: int = 0

    @property
    def removed_bytes(self) -> int:
        return sum(obj.size for obj in self.removed)


def collect_garbage(
    *,
    grace_hours: float = DEFAULT_GC_GRACE_HOURS,
    dry_run: bool = False,
    include_legacy: bool = False,
    database_url: str | None = None,
    artifacts_uri: str | None = None,
    now: dt.datetime | None = None,
) -> GcReport:
    """Remove objects of the environments store that no published version refers to and
    that are older than ``grace_hours``.

    ``include_legacy`` also sweeps ``<store>/sha256/``, where versions were published
    before the ``environments/`` layout (only do it if nothing else writes there).
    """
    if not grace_hours >= 0:
        raise VfopsError(f"--grace-hours must be 0 or more, not {grace_hours}")
    from vfops.artifacts import open_store
    from vfops.registry import get_engine, referenced_artifact_uris, session_scope

    stores: list[ArtifactStore] = [environment_store(artifacts_uri)]
    if include_legacy:
        stores.append(open_store(artifacts_uri))
    cutoff = (now or dt.datetime.now(dt.UTC)) - dt.timedelta(hours=grace_hours)
    report = GcReport(dry_run=dry_run, grace_hours=grace_hours)
    for store in stores:
        with store:
            # List first, then read the registry: a row committed in between is seen, and
            # an object uploaded in between is too young to be listed as a candidate.
            candidates = list(store.iter_objects())
            with session_scope(get_engine(database_url), write=False) as session:
                referenced = artifact_keys(referenced_artifact_uris(session))
            for obj in candidates:
                if (obj.sha256, obj.name) in referenced:
                    report.kept += 1
                elif obj.modified > cutoff:
                    report.young += 1
                else:
                    if not dry_run:
                        store.delete(obj.uri)
                    report.removed.append(obj)
    return report
