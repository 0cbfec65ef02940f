"""Evaluation: run an environment against a model and record every rollout.

:func:`evaluate_async` / :func:`evaluate` is the one entry point; the CLI, sweep
and nightly cells, promotion gates and tests all call it.
"""

from vfops.evaluation._evaluate import (
    EvalProgress,
    EvalResult,
    OpenedRun,
    evaluate,
    evaluate_async,
    registry_summary,
)
from vfops.evaluation._model import ModelOptions
from vfops.evaluation._provenance import Provenance, config_fingerprint, resolve_provenance
from vfops.evaluation._runner import EvalRequest
from vfops.evaluation._sinks import SinkError
from vfops.evaluation._store import iter_records, load_results, read_metadata
from vfops.evaluation._summary import EvalSummary, pass_at_k

__all__ = [
    "EvalProgress",
    "EvalRequest",
    "EvalResult",
    "EvalSummary",
    "ModelOptions",
    "OpenedRun",
    "Provenance",
    "SinkError",
    "config_fingerprint",
    "evaluate",
    "evaluate_async",
    "iter_records",
    "load_results",
    "pass_at_k",
    "read_metadata",
    "registry_summary",
    "resolve_provenance",
]
