"""An eval run's rollouts as MLflow traces: MLflow's Traces tab becomes a transcript viewer.

One trace per rollout, linked to the run's MLflow run (``mlflow.sourceRun``): its
request is the prompt (and the expected answer), its response the completion; a
span per model turn (``CHAT_MODEL``) and per tool call (``TOOL``), one for scoring;
each reward function's score, and the reward, as feedback (``CODE`` source), the
expected answer as an expectation, so the UI lists and filters rollouts by reward.

A run logs every failed or errored rollout, and at most
:func:`vfops._settings.trace_rollouts` passing ones (the first rollouts of every
example first, so a sample still covers the examples). Logged by the tracker
process after it answered the evaluation (:mod:`vfops.tracking._tracker_main`):
traces never hold an evaluation up.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from vfops._rollout import RolloutRecord

if TYPE_CHECKING:
    from mlflow.entities import LiveSpan

TRACE_ID_TAG: Final = "vfops.trace_id"
"""The rollout's own ``trace_id`` on its MLflow trace (logging a run again skips it)."""
REWARD_NAME: Final = "reward"
EXPECTED_NAME: Final = "expected_answer"
SOURCE_ID: Final = "vfops"
# MLflow's async export drops traces when its queue (1000) is full: flush per chunk
_CHUNK: Final = 250


def _failed(reward: float | None, error_type: str | None, pass_threshold: float) -> bool:
    # vfops.evaluation.rollout_failed on a flat row (the evaluation package stays unimported)
    return error_type is not None or reward is None or reward < pass_threshold


def select_rollouts(
    rollouts_file: str | Path, *, limit: int | None, pass_threshold: float = 1.0
) -> list[RolloutRecord]:
    """The rollouts of ``rollouts_file`` (Arrow stream or parquet) to log as traces:
    every failed or errored one, and ``limit`` passing ones (all when there are fewer)."""
    if limit is None:
        return []
    table = _read_table(Path(rollouts_file))
    rewards = table.column("reward").to_pylist()
    errors = table.column("error_type").to_pylist()
    examples = table.column("example_id").to_pylist()
    indexes = table.column("rollout_index").to_pylist()
    failed: list[int] = []
    passing: list[int] = []
    for row, (reward, error) in enumerate(zip(rewards, errors, strict=True)):
        (failed if _failed(reward, error, pass_threshold) else passing).append(row)
    passing.sort(key=lambda row: (indexes[row], examples[row]))
    chosen = sorted(failed + passing[:limit], key=lambda row: (examples[row], indexes[row]))
    return [RolloutRecord.from_row(row) for row in table.take(chosen).to_pylist()]


def _read_table(path: Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.name.endswith(".parquet"):
        return pq.read_table(str(path))
    with pa.OSFile(str(path), "rb") as handle:
        return pa.ipc.open_stream(handle).read_all()


@contextlib.contextmanager
def _tracing_to(tracking_uri: str) -> Iterator[None]:
    """MLflow's fluent tracing (the only API that attaches feedback to a trace before it is
    exported) writes to the global tracking URI: point it at ``tracking_uri`` meanwhile,
    then put back the URI and ``MLFLOW_TRACKING_URI`` (MLflow sets the variable too)."""
    import mlflow

    variable = os.environ.get("MLFLOW_TRACKING_URI")
    was_set: bool = mlflow.is_tracking_uri_set()  # type: ignore[no-untyped-call]
    previous = mlflow.get_tracking_uri() if was_set else None
    mlflow.set_tracking_uri(tracking_uri)
    try:
        yield
    finally:
        mlflow.flush_trace_async_logging()
        mlflow.set_tracking_uri(previous)  # type: ignore[arg-type]  # None: unset again
        if variable is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = variable


def logged_trace_ids(tracking_uri: str, experiment_id: str, mlflow_run_id: str) -> set[str]:
    """The rollout ``trace_id`` of every trace already logged for the MLflow run."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    found: set[str] = set()
    token: str | None = None
    while True:
        page = client.search_traces(
            locations=[experiment_id], run_id=mlflow_run_id, include_spans=False,
            max_results=500, page_token=token,
        )  # fmt: skip
        found.update(t.info.tags[TRACE_ID_TAG] for t in page if TRACE_ID_TAG in t.info.tags)
        token = page.token
        if not token:
            return found


def log_traces(
    records: Sequence[RolloutRecord],
    *,
    tracking_uri: str,
    experiment_id: str,
    mlflow_run_id: str,
    tags: dict[str, str],
    pass_threshold: float = 1.0,
    skip_logged: bool = False,
) -> int:
    """Log ``records`` as traces of MLflow run ``mlflow_run_id``; return how many were logged.

    ``tags`` go on every trace; ``skip_logged``: the run was logged before, so rollouts
    whose trace is already there are skipped (logging a run again is idempotent).
    """
    if not records:
        return 0
    with _tracing_to(tracking_uri):
        import mlflow

        done = (
            logged_trace_ids(tracking_uri, experiment_id, mlflow_run_id) if skip_logged else set()
        )
        todo = [r for r in records if r.trace_id not in done]
        for start in range(0, len(todo), _CHUNK):
            for record in todo[start : start + _CHUNK]:
                _log_one(record, experiment_id, mlflow_run_id, tags, pass_threshold)
            mlflow.flush_trace_async_logging()
    return len(todo)


def _log_one(
    record: RolloutRecord,
    experiment_id: str,
    mlflow_run_id: str,
    tags: dict[str, str],
    pass_threshold: float,
) -> None:
    import mlflow
    from mlflow.entities import AssessmentError, AssessmentSource, SpanType
    from mlflow.entities.trace_location import MlflowExperimentLocation

    source = AssessmentSource(source_type="CODE", source_id=SOURCE_ID)
    failed = _failed(record.reward, None if record.error is None else record.error.type,
                     pass_threshold)  # fmt: skip
    trace_tags = {
        **tags,
        TRACE_ID_TAG: record.trace_id,
        "vfops.example_id": str(record.example_id),
        "vfops.rollout_index": str(record.rollout_index),
        "vfops.stop_reason": record.stop_reason,
        "vfops.failed": str(failed).lower(),
    }
    with mlflow.start_span(
        name=f"example {record.example_id} rollout {record.rollout_index}",
        span_type=SpanType.AGENT,
        run_id=mlflow_run_id,
        trace_destination=MlflowExperimentLocation(experiment_id),
    ) as root:
        root.set_inputs(_request(record))
        root.set_attributes(_facts(record))
        _turn_spans(root, record)
        _score_span(root, record)
        mlflow.update_current_trace(tags=trace_tags)
        trace_id = root.trace_id
        if record.answer:
            mlflow.log_expectation(
                trace_id=trace_id, name=EXPECTED_NAME, value=record.answer, source=source
            )
        for name, score in record.metrics.items():
            mlflow.log_feedback(trace_id=trace_id, name=name, value=float(score), source=source)
        if record.error is not None or record.reward is None:
            error = record.error
            mlflow.log_feedback(
                trace_id=trace_id,
                name=REWARD_NAME,
                source=source,
                error=AssessmentError(
                    error_code=error.type if error else "NoReward",
                    error_message=f"{error.stage}: {error.message}" if error else "not scored",
                ),
            )
        else:
            mlflow.log_feedback(
                trace_id=trace_id, name=REWARD_NAME, value=float(record.reward), source=source
            )
        root.set_outputs(_response(record))
        if record.error is not None:
            root.set_status("ERROR")


def _request(record: RolloutRecord) -> dict[str, Any]:
    request: dict[str, Any] = {"messages": record.prompt}
    if record.answer:
        request["expected_answer"] = record.answer
    return request


def _response(record: RolloutRecord) -> dict[str, Any]:
    response: dict[str, Any] = {"messages": record.completion, "stop_reason": record.stop_reason}
    if record.error is not None:
        response["error"] = record.error.to_dict()
    return response


def _facts(record: RolloutRecord) -> dict[str, Any]:
    return {
        "example_id": record.example_id,
        "rollout_index": record.rollout_index,
        "task": record.task,
        "model": record.model,
        "turns": record.turns,
        "stop_reason": record.stop_reason,
        "prompt_tokens": record.usage.prompt_tokens,
        "completion_tokens": record.usage.completion_tokens,
        "generation_ms": record.timing.generation_ms,
        "scoring_ms": record.timing.scoring_ms,
    }


def _arguments(call: dict[str, Any]) -> Any:
    function = call.get("function") or {}
    arguments = function.get("arguments", call.get("arguments", ""))
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _turn_spans(root: LiveSpan, record: RolloutRecord) -> None:
    """A ``CHAT_MODEL`` span per assistant message (its inputs: the messages since the
    previous turn, the prompt for the first), then a ``TOOL`` span per tool call it made
    (its output: the tool message answering it)."""
    import mlflow
    from mlflow.entities import SpanType

    results = {m.get("tool_call_id"): m for m in record.completion if m.get("role") == "tool"}
    pending: list[dict[str, Any]] = list(record.prompt)
    turn = 0
    for message in record.completion:
        if message.get("role") != "assistant":
            pending.append(message)  # what the model reads next (tool results too)
            continue
        turn += 1
        span = mlflow.start_span_no_context(
            name=f"turn {turn}",
            span_type=SpanType.CHAT_MODEL,
            parent_span=root,
            inputs={"messages": pending},
            attributes={"turn": str(turn)},
        )
        span.end(outputs=message)
        pending = []
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            result = results.get(call.get("id"))
            tool = mlflow.start_span_no_context(
                name=str(function.get("name") or call.get("name") or "tool"),
                span_type=SpanType.TOOL,
                parent_span=root,
                inputs=_arguments(call),
                attributes={"turn": str(turn), "tool_call_id": str(call.get("id") or "")},
            )
            tool.end(outputs=None if result is None else result.get("content"))


def _score_span(root: LiveSpan, record: RolloutRecord) -> None:
    import mlflow
    from mlflow.entities import SpanType

    span = mlflow.start_span_no_context(
        name="score",
        span_type=SpanType.EVALUATOR,
        parent_span=root,
        inputs={"answer": record.answer},
        attributes={"scoring_ms": str(record.timing.scoring_ms)},
    )
    span.end(outputs={"reward": record.reward, **record.metrics})
