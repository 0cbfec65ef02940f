"""Shared set-up of the registry tests: one database per test, SQLite and PostgreSQL.

Each test file declares its own parametrized fixture that delegates to
:func:`database_url`, so every registry test runs on both dialects. PostgreSQL
tests get a fresh schema (through ``search_path``, so the tables and the Alembic
version table of one test are invisible to every other) that is dropped after.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from tests.strict_skips import STRICT_VAR, strict
from vfops._rollout import RolloutError, RolloutRecord, Timing, TokenUsage
from vfops.registry import (
    count_rollouts,
    dispose_engines,
    insert_rollouts,
    iter_rollouts,
    rollouts_for_example,
    session_scope,
)

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


# The registry's rollout functions take a Session (the caller's transaction); the tests
# that only check what a run stored read and write through these one-transaction twins.


def store_rollouts(engine: Engine, run_id: str, records: Sequence[RolloutRecord]) -> int:
    """:func:`vfops.registry.insert_rollouts` in one write transaction."""
    with session_scope(engine) as session:
        return insert_rollouts(session, run_id, records)


def stored_rollouts(engine: Engine, run_id: str, batch_size: int = 1000) -> list[RolloutRecord]:
    """Every stored rollout of a run (:func:`vfops.registry.iter_rollouts`), in key order."""
    with session_scope(engine, write=False) as session:
        return list(iter_rollouts(session, run_id, batch_size=batch_size))


def stored_count(engine: Engine, run_id: str) -> int:
    """:func:`vfops.registry.count_rollouts` in one read transaction."""
    with session_scope(engine, write=False) as session:
        return count_rollouts(session, run_id)


def stored_for_example(engine: Engine, run_id: str, example_id: int) -> list[RolloutRecord]:
    """:func:`vfops.registry.rollouts_for_example` in one read transaction."""
    with session_scope(engine, write=False) as session:
        return rollouts_for_example(session, run_id, example_id)
