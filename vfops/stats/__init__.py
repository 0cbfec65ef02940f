"""Statistics over eval runs: streaming summaries, paired tests and a measured noise floor.

:class:`EvalSummary` (constant memory in the number of rollouts) is pure Python; the tests
import numpy. Names load on first use, so the evaluation's hot path, which keeps a summary,
never imports numpy, and ``import vfops`` does not import this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vfops._lazy import lazy_exports

if TYPE_CHECKING:
    from vfops.stats._noise import NoiseFloor, noise_floor
    from vfops.stats._paired import (
        DEFAULT_PASS_THRESHOLD,
        McNemarResult,
        PairedResult,
        is_binary,
        mcnemar,
        mcnemar_exact_p,
        paired_bootstrap,
        per_example_pass,
    )
    from vfops.stats._regression import (
        DETECTION_POWER,
        RegressionReport,
        compare_runs_statistically,
        format_p,
        min_detectable_effect,
    )
    from vfops.stats._summary import EvalSummary, pass_at_k

__all__ = [
    "DEFAULT_PASS_THRESHOLD",
    "DETECTION_POWER",
    "EvalSummary",
    "McNemarResult",
    "NoiseFloor",
    "PairedResult",
    "RegressionReport",
    "compare_runs_statistically",
    "format_p",
    "is_binary",
    "mcnemar",
    "mcnemar_exact_p",
    "min_detectable_effect",
    "noise_floor",
    "paired_bootstrap",
    "pass_at_k",
    "per_example_pass",
]

_MODULES = {
    "vfops.stats._noise": ("NoiseFloor", "noise_floor"),
    "vfops.stats._paired": (
        "DEFAULT_PASS_THRESHOLD",
        "McNemarResult",
        "PairedResult",
        "is_binary",
        "mcnemar",
        "mcnemar_exact_p",
        "paired_bootstrap",
        "per_example_pass",
    ),
    "vfops.stats._regression": (
        "DETECTION_POWER",
        "RegressionReport",
        "compare_runs_statistically",
        "format_p",
        "min_detectable_effect",
    ),
    "vfops.stats._summary": ("EvalSummary", "pass_at_k"),
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
