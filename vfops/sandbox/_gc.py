"""``vfops sandbox gc``: ask the engine for every vfops container and remove the dead's."""

from __future__ import annotations

from dataclasses import dataclass, field

from vfops.sandbox._engine import CliEngine, ContainerEngine
from vfops.sandbox._owners import (
    OWNER_LABEL,
    ROLLOUT_LABEL,
    RUN_LABEL,
    SANDBOX_LABEL,
    owner_alive,
    reap_dead_owners,
)


@dataclass
class Removed:
    container: str
    owner: str
    run: str | None
    rollout: str | None


@dataclass
class GcReport:
    removed: list[Removed] = field(default_factory=list)
    kept_live: int = 0
    """Containers whose owner process is alive (they are in use)."""


def collect_garbage(engine: ContainerEngine, *, run: str | None = None) -> GcReport:
    """Remove every vfops container whose owner process is dead (``run``: only that
    run's, dead or alive — a run a user knows is over)."""
    reap_dead_owners(engine)  # the markers of dead owners go too
    found = engine.list_labelled(SANDBOX_LABEL)
    labels = engine.labels_of(found) if isinstance(engine, CliEngine) else {}
    report = GcReport()
    doomed: list[Removed] = []
    for container in found:
        mine = next((v for k, v in labels.items() if k.startswith(container)), {})
        owner = mine.get(OWNER_LABEL, "")
        selected = mine.get(RUN_LABEL) == run if run is not None else not owner_alive(owner)
        if selected:
            doomed.append(Removed(container, owner, mine.get(RUN_LABEL), mine.get(ROLLOUT_LABEL)))
        else:
            report.kept_live += 1
    engine.remove_sync([item.container for item in doomed])
    report.removed = doomed
    return report
