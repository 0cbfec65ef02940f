"""Evaluation: run an environment against a model and record every rollout.

:func:`evaluate_async` / :func:`evaluate` is the one entry point; the CLI, sweep
and nightly cells, promotion gates and tests all call it, with :class:`RunOptions`
for where the run is recorded and, optionally, ``sinks=`` of their own (a
:class:`Sink` gets every scored group, after the run's own sinks: :func:`open_sinks`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vfops._lazy import lazy_exports

if TYPE_CHECKING:
    from vfops._folder_lock import RunFolderBusyError
    from vfops.evaluation._compare import compare_runs, per_example_rewards
    from vfops.evaluation._default_sinks import DefaultSinks, Recording, open_sinks, opens_at_start
    from vfops.evaluation._evaluate import evaluate, evaluate_async
    from vfops.evaluation._export import export_run, run_metadata
    from vfops.evaluation._model import ModelOptions, resolve_model_name
    from vfops.evaluation._open_run import registry_summary
    from vfops.evaluation._plugins import (
        BUILT_IN_SINKS,
        MIDDLEWARE_GROUP,
        SINK_GROUP,
        RunInfo,
        check_middleware_names,
        check_sink_names,
        middleware_names,
        sink_names,
    )
    from vfops.evaluation._provenance import Provenance, config_fingerprint, resolve_provenance
    from vfops.evaluation._result import (
        DEFAULT_MAX_ERROR_RATE,
        DEFAULT_MAX_TOOL_ERROR_RATE,
        DEFAULT_OUTPUT_ROOT,
        EvalProgress,
        EvalResult,
        OpenedRun,
        Outcome,
        RunEnded,
        RunOptions,
    )
    from vfops.evaluation._runner import EvalRequest
    from vfops.evaluation._sinks import RunFinish, Sink, SinkError
    from vfops.evaluation._store import iter_records, load_results, read_metadata
    from vfops.evaluation._transcript import format_transcript, rollout_failed
    from vfops.stats import EvalSummary, pass_at_k

__all__ = [
    "BUILT_IN_SINKS",
    "DEFAULT_MAX_ERROR_RATE",
    "DEFAULT_MAX_TOOL_ERROR_RATE",
    "DEFAULT_OUTPUT_ROOT",
    "MIDDLEWARE_GROUP",
    "SINK_GROUP",
    "DefaultSinks",
    "EvalProgress",
    "EvalRequest",
    "EvalResult",
    "EvalSummary",
    "ModelOptions",
    "OpenedRun",
    "Outcome",
    "Provenance",
    "Recording",
    "RunEnded",
    "RunFinish",
    "RunFolderBusyError",
    "RunInfo",
    "RunOptions",
    "Sink",
    "SinkError",
    "check_middleware_names",
    "check_sink_names",
    "compare_runs",
    "config_fingerprint",
    "evaluate",
    "evaluate_async",
    "export_run",
    "format_transcript",
    "iter_records",
    "load_results",
    "middleware_names",
    "open_sinks",
    "opens_at_start",
    "pass_at_k",
    "per_example_rewards",
    "read_metadata",
    "registry_summary",
    "resolve_model_name",
    "resolve_provenance",
    "rollout_failed",
    "run_metadata",
    "sink_names",
]

_LAZY = {
    "SINK_GROUP": "vfops.evaluation._plugins",
    "BUILT_IN_SINKS": "vfops.evaluation._plugins",
    "MIDDLEWARE_GROUP": "vfops.evaluation._plugins",
    "check_middleware_names": "vfops.evaluation._plugins",
    "check_sink_names": "vfops.evaluation._plugins",
    "middleware_names": "vfops.evaluation._plugins",
    "RunInfo": "vfops.evaluation._plugins",
    "sink_names": "vfops.evaluation._plugins",
    "compare_runs": "vfops.evaluation._compare",
    "per_example_rewards": "vfops.evaluation._compare",
    "DEFAULT_MAX_ERROR_RATE": "vfops.evaluation._result",
    "DEFAULT_MAX_TOOL_ERROR_RATE": "vfops.evaluation._result",
    "DEFAULT_OUTPUT_ROOT": "vfops.evaluation._result",
    "EvalProgress": "vfops.evaluation._result",
    "EvalResult": "vfops.evaluation._result",
    "OpenedRun": "vfops.evaluation._result",
    "Outcome": "vfops.evaluation._result",
    "RunEnded": "vfops.evaluation._result",
    "RunOptions": "vfops.evaluation._result",
    "DefaultSinks": "vfops.evaluation._default_sinks",
    "open_sinks": "vfops.evaluation._default_sinks",
    "opens_at_start": "vfops.evaluation._default_sinks",
    "Recording": "vfops.evaluation._default_sinks",
    "evaluate": "vfops.evaluation._evaluate",
    "evaluate_async": "vfops.evaluation._evaluate",
    "registry_summary": "vfops.evaluation._open_run",
    "export_run": "vfops.evaluation._export",
    "run_metadata": "vfops.evaluation._export",
    "RunFolderBusyError": "vfops._folder_lock",
    "ModelOptions": "vfops.evaluation._model",
    "resolve_model_name": "vfops.evaluation._model",
    "Provenance": "vfops.evaluation._provenance",
    "config_fingerprint": "vfops.evaluation._provenance",
    "resolve_provenance": "vfops.evaluation._provenance",
    "EvalRequest": "vfops.evaluation._runner",
    "RunFinish": "vfops.evaluation._sinks",
    "Sink": "vfops.evaluation._sinks",
    "SinkError": "vfops.evaluation._sinks",
    "iter_records": "vfops.evaluation._store",
    "load_results": "vfops.evaluation._store",
    "read_metadata": "vfops.evaluation._store",
    "EvalSummary": "vfops.stats._summary",
    "pass_at_k": "vfops.stats._summary",
    "format_transcript": "vfops.evaluation._transcript",
    "rollout_failed": "vfops.evaluation._transcript",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
