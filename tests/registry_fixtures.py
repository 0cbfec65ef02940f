"""Shared set-up of the registry tests: one database per test, SQLite and PostgreSQL.

Each test file declares its own parametrized fixture that delegates to
:func:`database_url`, so every registry test runs on both dialects. PostgreSQL
tests get a fresh schema (through ``search_path``, so the tables and the Alembic
version table of one test are invisible to every other) that is dropped after.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from tests.strict_skips import STRICT_VAR, strict
from vfops._rollout import RolloutError, RolloutRecord, Timing, TokenUsage
from vfops.registry import dispose_engines

PG_URL = os.environ.get("VFOPS_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
DIALECTS = ["sqlite", "postgresql"]


def database_url(dialect: str, tmp_path: Path) -> Iterator[str]:
    """A URL of an empty database of ``dialect``, removed after the test."""
    if dialect == "sqlite":
        yield f"sqlite:///{tmp_path / 'home' / 'registry.db'}"
        dispose_engines()
        return
    admin = create_engine(PG_URL, poolclass=NullPool)
    schema = f"vfops_test_{uuid.uuid4().hex[:12]}"
    try:
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    except OperationalError as exc:
        admin.dispose()
        problem = f"PostgreSQL is not reachable at {PG_URL}: {exc.orig}"
        if strict():  # CI: the PostgreSQL variants must run, not skip
            pytest.fail(
                f"{problem}; {STRICT_VAR}=1 (CI) needs it: start it or set VFOPS_TEST_PG_URL"
            )
        pytest.skip(problem)
    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        dispose_engines()  # close pooled connections before dropping their schema
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def make_record(example_id: int, rollout_index: int, **overrides: Any) -> RolloutRecord:
    """A realistic rollout: multi-turn messages, nested info, metrics and timings."""
    fields: dict[str, Any] = {
        "example_id": example_id,
        "rollout_index": rollout_index,
        "prompt": [
            {"role": "system", "content": "Answer in <answer> tags."},
            {"role": "user", "content": f"What is {example_id} + {rollout_index}? é ✓ 数"},
        ],
        "completion": [
            {"role": "assistant", "content": f"<answer>{example_id + rollout_index}</answer>"},
            {"role": "tool", "content": "ok", "tool_call_id": "call_1"},
        ],
        "answer": str(example_id + rollout_index),
        "info": {"split": "eval", "nested": {"level": [1, 2.5, None, True]}},
        "task": "arithmetic",
        "reward": 1.0 if rollout_index % 2 == 0 else 0.25,
        "metrics": {"correct": 1.0, "format": 0.5},
        "stop_reason": "completed",
        "timing": Timing(generation_ms=12.5, scoring_ms=0.75),
        "usage": TokenUsage(prompt_tokens=31, completion_tokens=7),
        "turns": 2,
        "model": "test-model",
        "sampling_args": {"temperature": 0.7, "max_tokens": 64},
    }
    fields.update(overrides)
    return RolloutRecord(**fields)


def make_error_record(example_id: int, rollout_index: int) -> RolloutRecord:
    return make_record(
        example_id,
        rollout_index,
        reward=None,
        metrics={},
        stop_reason="error",
        error=RolloutError(type="TimeoutError", message="judge timed out", stage="scoring"),
    )
