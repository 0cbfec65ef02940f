"""Rollouts as MLflow traces, written in batches straight to the tracking store.

MLflow's fluent tracing (``start_span`` … ``log_feedback``) writes a trace in five or
more transactions (a ``log_spans`` per span as it ends, the trace's info, each
assessment): ~45 ms of CPU per trace here, more than the rollout it records. A rollout
is finished when it is traced, so nothing needs to be live: each trace is built whole
(its spans, and its assessments inside its ``TraceInfo``) and written with
``start_trace`` (one transaction: info, tags, metadata, assessments), and the spans of
a whole batch of traces with one ``log_spans``. What the store holds is what the fluent
API would have written (:mod:`vfops.tracking._traces` builds the same content; the
tests read both back the same way).
"""

from __future__ import annotations

import base64
import json
import os
import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from vfops._rollout import RolloutRecord

if TYPE_CHECKING:
    from mlflow.entities import Assessment, Span, TraceInfo

_PREVIEW_CHARS: Final = 1000
_SPAN_TYPE: Final = "mlflow.spanType"
_INPUTS: Final = "mlflow.spanInputs"
_OUTPUTS: Final = "mlflow.spanOutputs"
_REQUEST_ID: Final = "mlflow.traceRequestId"


def _dumps(value: Any) -> str:
    # as MLflow serialises span attributes (JSON, non-ASCII kept)
    return json.dumps(value, ensure_ascii=False, default=str)


def _b64(value: int, size: int) -> str:
    return base64.b64encode(value.to_bytes(size, "big")).decode()


class _TraceBuilder:
    """The spans of one trace, as the dictionaries ``Span.from_dict`` reads."""

    def __init__(self, trace_id: str, otel_trace_id: int, start_ns: int) -> None:
        self.trace_id = trace_id
        self._otel = _b64(otel_trace_id, 16)
        self._start = self._clock = start_ns
        self.spans: list[dict[str, Any]] = []

    def span(
        self,
        name: str,
        span_type: str,
        *,
        parent: str | None,
        inputs: Any,
        outputs: Any,
        attributes: dict[str, Any] | None = None,
        error: bool = False,
        extra: dict[str, str] | None = None,
        duration_ns: int = 0,
    ) -> str:
        """Add a span; a child starts where the previous one ended (the root at the start)."""
        span_id = _b64(random.getrandbits(64) or 1, 8)
        status = "STATUS_CODE_ERROR" if error else "STATUS_CODE_OK"
        start = self._clock
        if parent is not None:
            self._clock += max(duration_ns, 1000)
        encoded = {
            _REQUEST_ID: _dumps(self.trace_id),
            _SPAN_TYPE: _dumps(span_type),
            _INPUTS: _dumps(inputs),
            _OUTPUTS: _dumps(outputs),
            **(extra or {}),
            **{k: _dumps(v) for k, v in (attributes or {}).items()},
        }
        self.spans.append(
            {
                "trace_id": self._otel,
                "span_id": span_id,
                "parent_span_id": parent,
                "name": name,
                "start_time_unix_nano": start,
                "end_time_unix_nano": self._clock,
                "events": [],
                "status": {"code": status, "message": ""},
                "attributes": encoded,
                "links": [],
            }
        )
        return span_id

    def end_root(self) -> int:
        """The root span ends with its last child; returns the trace's length in ms."""
        self.spans[0]["end_time_unix_nano"] = self._clock
        return max(1, (self._clock - self._start) // 1_000_000)


def build_trace(
    record: RolloutRecord,
    *,
    experiment_id: str,
    mlflow_run_id: str,
    tags: dict[str, str],
    pass_threshold: float,
) -> tuple[TraceInfo, list[Span]]:
    """The trace of ``record``: its ``TraceInfo`` (tags, metadata, assessments) and spans."""
    from mlflow.entities import Span, TraceInfo, TraceLocation, TraceState

    from vfops.tracking import _traces as content

    otel_trace_id = random.getrandbits(128) or 1
    trace_id = f"tr-{otel_trace_id:032x}"
    generation_ns = int(record.timing.generation_ms * 1e6)
    scoring_ns = int(record.timing.scoring_ms * 1e6)
    # it ended just now, after its generation and scoring (the record holds no clock time)
    start_ns = time.time_ns() - generation_ns - scoring_ns
    builder = _TraceBuilder(trace_id, otel_trace_id, start_ns)
    request, response = content.request_of(record), content.response_of(record)
    failed = content.rollout_failed(record, pass_threshold)
    root = builder.span(
        f"example {record.example_id} rollout {record.rollout_index}",
        "AGENT",
        parent=None,
        inputs=request,
        outputs=response,
        attributes=content.facts_of(record),
        error=record.error is not None,
        extra={"mlflow.experimentId": _dumps(experiment_id)},
    )
    turns = content.turns_of(record)
    model_turns = sum(1 for turn in turns if turn.span_type == "CHAT_MODEL") or 1
    for turn in turns:  # the generation time shared among the model's turns
        duration = generation_ns // model_turns if turn.span_type == "CHAT_MODEL" else 0
        builder.span(turn.name, turn.span_type, parent=root, inputs=turn.inputs,
                     outputs=turn.outputs, attributes=turn.attributes,
                     duration_ns=duration)  # fmt: skip
    score = content.score_of(record)
    builder.span(score.name, score.span_type, parent=root, inputs=score.inputs,
                 outputs=score.outputs, attributes=score.attributes,
                 duration_ns=scoring_ns)  # fmt: skip
    execution_ms = builder.end_root()
    name = builder.spans[0]["name"]
    info = TraceInfo(
        trace_id=trace_id,
        trace_location=TraceLocation.from_experiment_id(experiment_id),
        request_time=start_ns // 1_000_000,
        state=TraceState.ERROR if record.error is not None else TraceState.OK,
        request_preview=_preview(content.last_content(record.prompt, "user")),
        response_preview=_preview(content.last_content(record.completion, "assistant")),
        execution_duration=execution_ms,
        trace_metadata={
            "mlflow.sourceRun": mlflow_run_id,
            "mlflow.trace_schema.version": "3",
            "mlflow.traceInputs": _preview(_dumps(request)) or "",
            "mlflow.traceOutputs": _preview(_dumps(response)) or "",
            "mlflow.user": os.environ.get("USER", ""),
        },
        tags={
            **content.trace_tags(record, tags, failed=failed),
            "mlflow.traceName": name,
            "mlflow.trace.spansLocation": "TRACKING_STORE",
        },
        assessments=_assessments(record),
    )
    spans = [Span.from_dict(span) for span in builder.spans]
    return info, spans


def _preview(text: str | None) -> str | None:
    if text is None:
        return None
    return text if len(text) <= _PREVIEW_CHARS else text[: _PREVIEW_CHARS - 3] + "..."


def _assessments(record: RolloutRecord) -> list[Assessment]:
    from mlflow.entities import AssessmentError, AssessmentSource, Expectation, Feedback

    from vfops.tracking._traces import EXPECTED_NAME, REWARD_NAME, SOURCE_ID

    source = AssessmentSource(source_type="CODE", source_id=SOURCE_ID)
    found: list[Assessment] = []
    if record.answer:
        found.append(Expectation(name=EXPECTED_NAME, value=record.answer, source=source))
    for name, score in record.metrics.items():
        found.append(Feedback(name=name, value=float(score), source=source))
    if record.error is not None or record.reward is None:
        error = record.error
        found.append(
            Feedback(
                name=REWARD_NAME,
                source=source,
                error=AssessmentError(
                    error_code=error.type if error else "NoReward",
                    error_message=f"{error.stage}: {error.message}" if error else "not scored",
                ),
            )
        )
    else:
        found.append(Feedback(name=REWARD_NAME, value=float(record.reward), source=source))
    return found


def write_traces(
    records: Sequence[RolloutRecord],
    *,
    tracking_uri: str,
    experiment_id: str,
    mlflow_run_id: str,
    tags: dict[str, str],
    pass_threshold: float,
) -> int:
    """Write ``records`` as traces of ``mlflow_run_id``: a transaction per trace for its
    info, one for all their spans. Returns how many were written."""
    if not records:
        return 0
    from mlflow.tracing.client import TracingClient

    client = TracingClient(tracking_uri)
    spans: list[Span] = []
    for record in records:
        info, trace_spans = build_trace(
            record, experiment_id=experiment_id, mlflow_run_id=mlflow_run_id, tags=tags,
            pass_threshold=pass_threshold,
        )  # fmt: skip
        client.start_trace(info)
        spans += trace_spans
    client.log_spans(experiment_id, spans)
    return len(records)


_CHUNK: Final = 250
"""Traces written per batch (one transaction for all their spans)."""


class TraceWriter:
    """Logs rollouts as traces of one MLflow run, in batches
    (:func:`write_traces`)."""

    def __init__(
        self,
        *,
        tracking_uri: str,
        experiment_id: str,
        mlflow_run_id: str,
        tags: dict[str, str],
        pass_threshold: float = 1.0,
        skip_logged: bool = False,
    ) -> None:
        self._tracking_uri = tracking_uri
        self._experiment_id = experiment_id
        self._mlflow_run_id = mlflow_run_id
        self._tags = tags
        self._pass_threshold = pass_threshold
        from vfops.tracking._traces import logged_trace_ids

        self._logged = (
            logged_trace_ids(tracking_uri, experiment_id, mlflow_run_id) if skip_logged else set()
        )
        self.count = 0

    def log(self, records: Sequence[RolloutRecord]) -> int:
        """Log ``records`` (those not logged before); return how many were logged."""
        from vfops.tracking._client import quiet

        todo = [r for r in records if r.trace_id not in self._logged]
        for start in range(0, len(todo), _CHUNK):
            with quiet():
                write_traces(
                    todo[start : start + _CHUNK],
                    tracking_uri=self._tracking_uri,
                    experiment_id=self._experiment_id,
                    mlflow_run_id=self._mlflow_run_id,
                    tags=self._tags,
                    pass_threshold=self._pass_threshold,
                )
        self._logged.update(r.trace_id for r in todo)
        self.count += len(todo)
        return len(todo)
