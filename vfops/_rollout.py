"""The rollout record: one trace of one model attempt at one example.

It is the unit every later layer consumes (the eval writer, the registry, the
trainer), so it serialises without loss to JSON and to a ``datasets`` row.
Free-form fields (messages, info, metrics, sampling args) become JSON strings in
a ``datasets`` row, because Arrow's struct inference would otherwise unify keys
across rows and invent ``None`` fields that were never there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from vfops._types import Info, Messages, SamplingArgs

StopReason = Literal[
    "completed",  # the model or the environment ended the rollout (is_completed)
    "max_turns",  # the turn budget ran out
    "length",  # the model hit max_tokens: the completion is truncated
    "prompt_too_long",  # the server refused the context as too long
    "timeout",  # the per-rollout timeout expired
    "error",  # generation or the environment raised; see ``error``
]

ErrorStage = Literal["generation", "environment", "scoring"]


@dataclass(slots=True)
class RolloutError:
    """What went wrong in a rollout: exception type, message and the stage."""

    type: str
    message: str
    stage: ErrorStage

    @classmethod
    def from_exception(cls, exc: BaseException, stage: ErrorStage) -> RolloutError:
        return cls(type=type(exc).__name__, message=str(exc)[:2000], stage=stage)

    def to_dict(self) -> dict[str, str]:
        return {"type": self.type, "message": self.message, "stage": self.stage}


@dataclass(slots=True)
class Timing:
    """Wall-clock milliseconds spent generating (model + environment) and scoring."""

    generation_ms: float = 0.0
    scoring_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return self.generation_ms + self.scoring_ms


@dataclass(slots=True)
class TokenUsage:
    """Token counts summed over every model call of the rollout."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens


def new_trace_id() -> str:
    # 128 random bits as hex, like uuid4().hex without building a UUID object.
    return os.urandom(16).hex()


@dataclass(slots=True)
class RolloutRecord:
    """One rollout, generated and scored. ``reward`` is ``None`` when scoring failed."""

    example_id: int
    rollout_index: int
    prompt: Messages
    completion: Messages
    answer: str = ""
    info: Info = field(default_factory=dict)
    task: str = "default"
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    stop_reason: StopReason = "completed"
    error: RolloutError | None = None
    timing: Timing = field(default_factory=Timing)
    usage: TokenUsage = field(default_factory=TokenUsage)
    turns: int = 0
    trace_id: str = field(default_factory=new_trace_id)
    model: str = ""
    sampling_args: SamplingArgs = field(default_factory=dict)

    @property
    def is_truncated(self) -> bool:
        return self.stop_reason == "length"

    @property
    def key(self) -> tuple[int, int]:
        """Identity of the rollout inside a run: (example_id, rollout_index)."""
        return (self.example_id, self.rollout_index)

    # --- JSON -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "trace_id": self.trace_id,
            "example_id": self.example_id,
            "rollout_index": self.rollout_index,
            "task": self.task,
            "prompt": self.prompt,
            "completion": self.completion,
            "answer": self.answer,
            "info": self.info,
            "reward": self.reward,
            "metrics": self.metrics,
            "stop_reason": self.stop_reason,
            "error": None if self.error is None else self.error.to_dict(),
            "timing": {
                "generation_ms": self.timing.generation_ms,
                "scoring_ms": self.timing.scoring_ms,
            },
            "usage": {
                "prompt_tokens": self.usage.prompt_tokens,
                "completion_tokens": self.usage.completion_tokens,
            },
            "turns": self.turns,
            "model": self.model,
            "sampling_args": self.sampling_args,
        }

    def to_json(self) -> bytes:
        """One JSON line (no trailing newline). Non-JSON values in info become strings."""
        return orjson.dumps(self.to_dict(), default=str, option=orjson.OPT_SERIALIZE_NUMPY)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutRecord:
        error = data.get("error")
        timing = data.get("timing") or {}
        usage = data.get("usage") or {}
        return cls(
            trace_id=data["trace_id"],
            example_id=int(data["example_id"]),
            rollout_index=int(data["rollout_index"]),
            task=data.get("task", "default"),
            prompt=data["prompt"],
            completion=data["completion"],
            answer=data.get("answer", ""),
            info=data.get("info") or {},
            reward=data.get("reward"),
            metrics=data.get("metrics") or {},
            stop_reason=data.get("stop_reason", "completed"),
            error=None if not error else RolloutError(**error),
            timing=Timing(**timing),
            usage=TokenUsage(**usage),
            turns=int(data.get("turns", 0)),
            model=data.get("model", ""),
            sampling_args=data.get("sampling_args") or {},
        )

    @classmethod
    def from_json(cls, line: bytes | str) -> RolloutRecord:
        return cls.from_dict(orjson.loads(line))

    # --- datasets rows ----------------------------------------------------------
    def to_row(self) -> dict[str, Any]:
        """A flat row whose columns match :func:`rollout_features`."""
        return {
            "trace_id": self.trace_id,
            "example_id": self.example_id,
            "rollout_index": self.rollout_index,
            "task": self.task,
            "prompt": _dumps(self.prompt),
            "completion": _dumps(self.completion),
            "answer": self.answer,
            "info": _dumps(self.info),
            "reward": self.reward,
            "metrics": _dumps(self.metrics),
            "stop_reason": self.stop_reason,
            "error_type": None if self.error is None else self.error.type,
            "error_message": None if self.error is None else self.error.message,
            "error_stage": None if self.error is None else self.error.stage,
            "generation_ms": self.timing.generation_ms,
            "scoring_ms": self.timing.scoring_ms,
            "prompt_tokens": self.usage.prompt_tokens,
            "completion_tokens": self.usage.completion_tokens,
            "turns": self.turns,
            "model": self.model,
            "sampling_args": _dumps(self.sampling_args),
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RolloutRecord:
        error = None
        if row.get("error_type") is not None:
            error = RolloutError(
                type=row["error_type"], message=row["error_message"], stage=row["error_stage"]
            )
        return cls(
            trace_id=row["trace_id"],
            example_id=int(row["example_id"]),
            rollout_index=int(row["rollout_index"]),
            task=row["task"],
            prompt=orjson.loads(row["prompt"]),
            completion=orjson.loads(row["completion"]),
            answer=row["answer"],
            info=orjson.loads(row["info"]),
            reward=row["reward"],
            metrics=orjson.loads(row["metrics"]),
            stop_reason=row["stop_reason"],
            error=error,
            timing=Timing(generation_ms=row["generation_ms"], scoring_ms=row["scoring_ms"]),
            usage=TokenUsage(
                prompt_tokens=row["prompt_tokens"], completion_tokens=row["completion_tokens"]
            ),
            turns=int(row["turns"]),
            model=row["model"],
            sampling_args=orjson.loads(row["sampling_args"]),
        )


def _dumps(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def rollout_features() -> Any:
    """The ``datasets.Features`` of a rollout row (imported lazily: datasets is heavy)."""
    from datasets import Features, Value

    string, i64, f64 = Value("string"), Value("int64"), Value("float64")
    return Features(
        {
            "trace_id": string,
            "example_id": i64,
            "rollout_index": i64,
            "task": string,
            "prompt": string,
            "completion": string,
            "answer": string,
            "info": string,
            "reward": f64,
            "metrics": string,
            "stop_reason": string,
            "error_type": string,
            "error_message": string,
            "error_stage": string,
            "generation_ms": f64,
            "scoring_ms": f64,
            "prompt_tokens": i64,
            "completion_tokens": i64,
            "turns": i64,
            "model": string,
            "sampling_args": string,
        }
    )
