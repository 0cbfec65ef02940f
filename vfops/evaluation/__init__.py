"""Evaluation: run an environment against a model and record every rollout.

:func:`evaluate_async` / :func:`evaluate` is the one entry point; the CLI, sweep
and nightly cells, promotion gates and tests all call it.
"""

from vfops.evaluation._compare import compare_runs, per_example_rewards
from vfops.evaluation._evaluate import (
    DEFAULT_MAX_ERROR_RATE,
    DEFAULT_OUTPUT_ROOT,
    EXIT_CODES,
    EvalProgress,
    EvalResult,
    OpenedRun,
    Outcome,
    evaluate,
    evaluate_async,
    registry_summary,
)
from vfops.evaluation._export import export_run, run_metadata
from vfops.evaluation._lock import RunFolderBusyError
from vfops.evaluation._model import ModelOptions, resolve_model_name
from vfops.evaluation._provenance import Provenance, config_fingerprint, resolve_provenance
from vfops.evaluation._runner import EvalRequest
from vfops.evaluation._sinks import SinkError
from vfops.evaluation._store import iter_records, load_results, read_metadata
from vfops.evaluation._summary import EvalSummary, pass_at_k
from vfops.evaluation._transcript import format_transcript, rollout_failed

__all__ = [
    "DEFAULT_MAX_ERROR_RATE",
    "DEFAULT_OUTPUT_ROOT",
    "EXIT_CODES",
    "EvalProgress",
    "EvalRequest",
    "EvalResult",
    "EvalSummary",
    "ModelOptions",
    "OpenedRun",
    "Outcome",
    "Provenance",
    "RunFolderBusyError",
    "SinkError",
    "compare_runs",
    "config_fingerprint",
    "evaluate",
    "evaluate_async",
    "export_run",
    "format_transcript",
    "iter_records",
    "load_results",
    "pass_at_k",
    "per_example_rewards",
    "read_metadata",
    "registry_summary",
    "resolve_model_name",
    "resolve_provenance",
    "rollout_failed",
    "run_metadata",
]
