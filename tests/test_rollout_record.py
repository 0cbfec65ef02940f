"""The rollout record round-trips through JSON, datasets and Arrow rows without loss.

Every form is derived from the one declaration, ``ROLLOUT_COLUMNS``.
"""

from __future__ import annotations

import dataclasses

import pytest
from datasets import Dataset

from vfops._rollout import (
    PART_TYPES,
    ROLLOUT_COLUMNS,
    RolloutError,
    RolloutRecord,
    Timing,
    TokenUsage,
    rollout_arrow_schema,
    rollout_features,
)


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


# A line written by the hand-spelled to_json before the schema was declared once
# (vfops 45e28b8): files on disk in this format must keep loading, unchanged.
OLD_LINE = (
    b'{"trace_id":"245d75b48346d4a2fb739193b49e4aa2","example_id":7,"rollout_index":2,'
    b'"task":"calc","prompt":[{"role":"system","content":"s"},{"role":"user","content":"q"}],'
    b'"completion":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":'
    b'"function","function":{"name":"calc","arguments":"{\\"x\\": 1}"}}]},{"role":"tool",'
    b'"tool_call_id":"c1","content":"1"},{"role":"assistant","content":"<answer>1</answer>"}],'
    b'"answer":"1","info":{"level":2,"tags":["a","b"],"nested":{"k":null}},"reward":0.75,'
    b'"metrics":{"correct":1.0,"format":0.5},"stop_reason":"completed","error":{"type":'
    b'"ValueError","message":"bad","stage":"scoring"},"timing":{"generation_ms":12.5,'
    b'"scoring_ms":0.25},"usage":{"prompt_tokens":30,"completion_tokens":9},"turns":2,'
    b'"model":"m","sampling_args":{"temperature":0.7,"max_tokens":64}}'
)


def test_old_jsonl_line_loads_and_is_written_byte_for_byte() -> None:
    record = RolloutRecord.from_json(OLD_LINE)
    assert record == sample_record(trace_id="245d75b48346d4a2fb739193b49e4aa2")
    # unchanged but for the fields added since (cost: migration 0005; an episode's
    # traces: 0008), at defaults
    assert record.to_json() == OLD_LINE.replace(
        b'"completion_tokens":9}', b'"completion_tokens":9,"cached_tokens":0,"cost_usd":null}'
    ).replace(b'"turns":2,', b'"turns":2,"episode":null,"agent":"",')
    assert record.usage.cost_usd is None  # unpriced, never 0


def test_sparse_json_record_takes_the_defaults() -> None:
    # what an older writer may have left out, or written as null
    line = (
        b'{"trace_id":"t","example_id":"3","rollout_index":0,"prompt":[],"completion":[],'
        b'"info":null,"error":null,"timing":{"generation_ms":5.0}}'
    )
    record = RolloutRecord.from_json(line)
    assert record == RolloutRecord(
        example_id=3,
        rollout_index=0,
        prompt=[],
        completion=[],
        trace_id="t",
        timing=Timing(generation_ms=5.0),
    )
    with pytest.raises(KeyError, match="trace_id"):
        RolloutRecord.from_dict(
            {"example_id": 1, "rollout_index": 0, "prompt": [], "completion": []}
        )


def test_declaration_covers_the_record_exactly() -> None:
    top = {c.part or c.name for c in ROLLOUT_COLUMNS}
    assert top == {f.name for f in dataclasses.fields(RolloutRecord)}
    for part, cls in PART_TYPES.items():
        keys = [c.attr for c in ROLLOUT_COLUMNS if c.part == part]
        assert keys == [f.name for f in dataclasses.fields(cls)], part
    no_default = {
        f.name
        for f in dataclasses.fields(RolloutRecord)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    assert no_default <= {c.name for c in ROLLOUT_COLUMNS if c.required}
    assert list(sample_record().to_row()) == [c.name for c in ROLLOUT_COLUMNS]


def test_arrow_schema_matches_the_features_and_round_trips() -> None:
    import pyarrow as pa

    schema = rollout_arrow_schema()
    features = rollout_features().arrow_schema
    assert schema.names == features.names
    assert [f.type for f in schema] == [f.type for f in features]
    assert [f.name for f in schema if f.nullable] == [
        "reward",
        "error_type",
        "error_message",
        "error_stage",
        "cost_usd",
        "episode",
    ]
    records = [sample_record(), sample_record(rollout_index=3, error=None, reward=None)]
    table = pa.Table.from_pylist([r.to_row() for r in records], schema=schema)
    table.validate(full=True)
    assert [RolloutRecord.from_row(row) for row in table.to_pylist()] == records
