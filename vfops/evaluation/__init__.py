"""Evaluation: run an environment against a model and stream the results."""

from vfops.evaluation._runner import EvalRequest, EvalResult, new_run_dir, run_eval_async
from vfops.evaluation._store import iter_records, load_results, read_metadata
from vfops.evaluation._summary import EvalSummary, pass_at_k

__all__ = [
    "EvalRequest",
    "EvalResult",
    "EvalSummary",
    "iter_records",
    "load_results",
    "new_run_dir",
    "pass_at_k",
    "read_metadata",
    "run_eval_async",
]
