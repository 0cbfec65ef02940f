"""Nightly sweeps: the spec (``nightly.toml``), tagging, previous-night lookup, paired
regression checks."""

from vfops.nightly._nightly import (
    NIGHTLY_TAG,
    CellComparison,
    compare_with_previous,
    night_of,
    nightly_history,
    nightly_tags,
    previous_nightly_run,
)
from vfops.nightly._spec import (
    DEFAULT_NIGHTLY_CRON,
    NightlyConfig,
    NightlyFile,
    NightlySchedule,
    load_nightly,
)

__all__ = [
    "DEFAULT_NIGHTLY_CRON",
    "NIGHTLY_TAG",
    "CellComparison",
    "NightlyConfig",
    "NightlyFile",
    "NightlySchedule",
    "compare_with_previous",
    "load_nightly",
    "night_of",
    "nightly_history",
    "nightly_tags",
    "previous_nightly_run",
]
