"""Statistics for comparing eval runs: paired tests and a measured noise floor.

Imports numpy; ``import vfops`` does not import this package.
"""

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

__all__ = [
    "DEFAULT_PASS_THRESHOLD",
    "DETECTION_POWER",
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
    "per_example_pass",
]
