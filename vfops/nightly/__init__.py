"""Nightly sweeps: tagging, previous-night lookup, paired regression checks."""

from vfops.nightly._nightly import (
    NIGHTLY_TAG,
    CellComparison,
    compare_with_previous,
    nightly_history,
    nightly_tags,
    previous_nightly_run,
)

__all__ = [
    "NIGHTLY_TAG",
    "CellComparison",
    "compare_with_previous",
    "nightly_history",
    "nightly_tags",
    "previous_nightly_run",
]
