"""An eval run's rollouts as MLflow traces: MLflow's Traces tab becomes a transcript viewer.

One trace per rollout, linked to the run's MLflow run (``mlflow.sourceRun``): its
request is the prompt (and the expected answer), its response the completion; a
span per model turn (``CHAT_MODEL``) and per tool call (``TOOL``), one for scoring;
each reward function's score, and the reward, as feedback (``CODE`` source), the
expected answer as an expectation, so the UI lists and filters rollouts by reward.

A run logs at most :func:`vfops._settings.trace_rollouts` failed or errored rollouts
and as many passing ones (those of rollout index 0 first, so a sample still covers
the examples): :class:`TraceSampler` chooses them while the run runs, in the tracker
process (:mod:`vfops.tracking._tracker_main`), which writes them in batches
(:mod:`vfops.tracking._trace_batch`) as they arrive.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from vfops._rollout import RolloutRecord

TRACE_ID_TAG: Final = "vfops.trace_id"
"""The rollout's own ``trace_id`` on its MLflow trace (logging a run again skips it)."""
REWARD_NAME: Final = "reward"
EXPECTED_NAME: Final = "expected_answer"
SOURCE_ID: Final = "vfops"


def _failed(reward: float | None, error_type: str | None, pass_threshold: float) -> bool:
    # vfops.evaluation.rollout_failed on a flat row (the evaluation package stays unimported)
    return error_type is not None or reward is None or reward < pass_threshold


def select_rollouts(
    rollouts_file: str | Path, *, limit: int | None, pass_threshold: float = 1.0
) -> list[RolloutRecord]:
    """The rollouts of ``rollouts_file`` (Arrow stream or parquet) to log as traces:
    ``limit`` failed or errored ones (errors first) and ``limit`` passing ones (all when
    there are fewer), as :class:`TraceSampler` chooses during a run."""
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
    failed.sort(key=lambda row: (errors[row] is None, examples[row], indexes[row]))
    passing.sort(key=lambda row: (indexes[row], examples[row]))
    chosen = sorted(failed[:limit] + passing[:limit],
                    key=lambda row: (examples[row], indexes[row]))  # fmt: skip
    return [RolloutRecord.from_row(row) for row in table.take(chosen).to_pylist()]


def _read_table(path: Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.name.endswith(".parquet"):
        return pq.read_table(str(path))
    with pa.OSFile(str(path), "rb") as handle:
        return pa.ipc.open_stream(handle).read_all()


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


class TraceSampler:
    """Chooses, as rollouts arrive, the ones of a run logged as traces.

    Every failed or errored rollout up to ``failed_limit``, and up to ``limit`` passing
    ones: those of rollout index 0 as they come (so a sample spreads over the
    examples), the others kept aside (at most ``limit``) to fill the sample at the end.
    Memory stays bounded whatever the run's size.
    """

    def __init__(self, *, limit: int, failed_limit: int, pass_threshold: float = 1.0) -> None:
        self._limit = limit
        self._failed_limit = failed_limit
        self._pass_threshold = pass_threshold
        self._passing = 0
        self._failed = 0
        self._reserve: list[dict[str, Any]] = []
        self.seen = 0

    def offer(self, row: dict[str, Any]) -> bool:
        """Whether the rollout ``row`` (its JSON record) is logged now."""
        self.seen += 1
        error = row.get("error")  # the record's error part (a dict), or None
        error_type = (error.get("type") or "error") if error else None
        if _failed(row.get("reward"), error_type, self._pass_threshold):
            if self._failed < self._failed_limit:
                self._failed += 1
                return True
            return False
        if self._passing >= self._limit:
            return False
        if row.get("rollout_index", 0) == 0:
            self._passing += 1
            return True
        if len(self._reserve) < self._limit:
            self._reserve.append(row)
        return False

    def rest(self) -> list[dict[str, Any]]:
        """The rollouts kept aside that the end of the run still has room for."""
        room = max(0, self._limit - self._passing)
        chosen, self._reserve = self._reserve[:room], []
        self._passing += len(chosen)
        return chosen


def rollout_failed(record: RolloutRecord, pass_threshold: float) -> bool:
    return _failed(record.reward, None if record.error is None else record.error.type,
                   pass_threshold)  # fmt: skip


def trace_tags(record: RolloutRecord, tags: dict[str, str], *, failed: bool) -> dict[str, str]:
    """The tags of a rollout's trace: the run's ``tags``, then the rollout's own."""
    return {
        **tags,
        TRACE_ID_TAG: record.trace_id,
        "vfops.example_id": str(record.example_id),
        "vfops.rollout_index": str(record.rollout_index),
        "vfops.stop_reason": record.stop_reason,
        "vfops.failed": str(failed).lower(),
    }


def last_content(messages: Sequence[dict[str, Any]], role: str) -> str | None:
    """The text of the last ``role`` message (a trace's preview in MLflow's list)."""
    for message in reversed(messages):
        if message.get("role") == role:
            content = message.get("content")
            if isinstance(content, str):
                return content
            return json.dumps(content, ensure_ascii=False, default=str)
    return None


@dataclass(frozen=True)
class SpanSpec:
    """One child span of a rollout's trace."""

    name: str
    span_type: str
    inputs: Any
    outputs: Any
    attributes: dict[str, str]


def request_of(record: RolloutRecord) -> dict[str, Any]:
    request: dict[str, Any] = {"messages": record.prompt}
    if record.answer:
        request["expected_answer"] = record.answer
    return request


def response_of(record: RolloutRecord) -> dict[str, Any]:
    response: dict[str, Any] = {"messages": record.completion, "stop_reason": record.stop_reason}
    if record.error is not None:
        response["error"] = record.error.to_dict()
    return response


def facts_of(record: RolloutRecord) -> dict[str, Any]:
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


def turns_of(record: RolloutRecord) -> list[SpanSpec]:
    """A ``CHAT_MODEL`` span per assistant message (its inputs: the messages since the
    previous turn, the prompt for the first), then a ``TOOL`` span per tool call it made
    (its output: the tool message answering it)."""
    results = {m.get("tool_call_id"): m for m in record.completion if m.get("role") == "tool"}
    pending: list[dict[str, Any]] = list(record.prompt)
    specs: list[SpanSpec] = []
    turn = 0
    for message in record.completion:
        if message.get("role") != "assistant":
            pending.append(message)  # what the model reads next (tool results too)
            continue
        turn += 1
        specs.append(SpanSpec(f"turn {turn}", "CHAT_MODEL", {"messages": pending}, message,
                              {"turn": str(turn)}))  # fmt: skip
        pending = []
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            result = results.get(call.get("id"))
            specs.append(
                SpanSpec(
                    str(function.get("name") or call.get("name") or "tool"),
                    "TOOL",
                    _arguments(call),
                    None if result is None else result.get("content"),
                    {"turn": str(turn), "tool_call_id": str(call.get("id") or "")},
                )
            )
    return specs


def score_of(record: RolloutRecord) -> SpanSpec:
    return SpanSpec(
        "score",
        "EVALUATOR",
        {"answer": record.answer},
        {"reward": record.reward, **record.metrics},
        {"scoring_ms": str(record.timing.scoring_ms)},
    )
