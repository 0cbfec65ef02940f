"""The rollout record round-trips through JSON and datasets rows without loss."""

from __future__ import annotations

from datasets import Dataset

from vfops._rollout import RolloutError, RolloutRecord, Timing, TokenUsage, rollout_features


def sample_record(**overrides: object) -> RolloutRecord:
    fields: dict[str, object] = {
        "example_id": 7,
        "rollout_index": 2,
        "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
        "completion": [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "calc", "arguments": '{"x": 1}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "1"},
            {"role": "assistant", "content": "<answer>1</answer>"},
        ],
        "answer": "1",
        "info": {"level": 2, "tags": ["a", "b"], "nested": {"k": None}},
        "task": "calc",
        "reward": 0.75,
        "metrics": {"correct": 1.0, "format": 0.5},
        "stop_reason": "completed",
        "error": RolloutError(type="ValueError", message="bad", stage="scoring"),
        "timing": Timing(generation_ms=12.5, scoring_ms=0.25),
        "usage": TokenUsage(prompt_tokens=30, completion_tokens=9),
        "turns": 2,
        "model": "m",
        "sampling_args": {"temperature": 0.7, "max_tokens": 64},
    }
    fields.update(overrides)
    return RolloutRecord(**fields)  # type: ignore[arg-type]


def test_json_round_trip() -> None:
    record = sample_record()
    assert RolloutRecord.from_json(record.to_json()) == record


def test_datasets_row_round_trip_through_arrow() -> None:
    records = [sample_record(), sample_record(rollout_index=3, error=None, reward=None, info={})]
    dataset = Dataset.from_list([r.to_row() for r in records], features=rollout_features())
    assert [RolloutRecord.from_row(row) for row in dataset] == records


def test_truncation_and_key() -> None:
    record = sample_record(stop_reason="length")
    assert record.is_truncated and record.key == (7, 2)
