"""Nightly comparison over real registry runs (SQLite and PostgreSQL)."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.registry_fixtures import DIALECTS, database_url, make_record
from vfops.nightly import compare_with_previous, nightly_history, nightly_tags
from vfops.registry import create_run, finish_run, get_engine, insert_rollouts, session_scope

EXAMPLES, ROLLOUTS = 150, 4


@pytest.fixture(params=DIALECTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path)


def nightly_run(
    db_url: str, day: dt.date, success: dict[int, float], rng: random.Random, *, model: str = "m"
) -> str:
    engine = get_engine(db_url)
    with session_scope(engine) as session:
        run = create_run(
            session,
            environment_name="arithmetic",
            environment_version="1.0.0",
            environment_content_hash="c" * 64,
            model=model,
            num_examples=EXAMPLES,
            rollouts_per_example=ROLLOUTS,
            config_fingerprint=f"fp-{day}-{model}",
            tags=nightly_tags(day),
        )
        run.started_at = dt.datetime.combine(day, dt.time(3), tzinfo=dt.UTC)
        run_id = run.id
    records = [
        make_record(e, i, reward=1.0 if rng.random() < success[e] else 0.0)
        for e in range(EXAMPLES)
        for i in range(ROLLOUTS)
    ]
    insert_rollouts(engine, run_id, records)
    mean = sum(r.reward or 0.0 for r in records) / len(records)
    with session_scope(engine) as session:
        finish_run(session, run_id, "completed", {"reward_mean": mean, "reward_stderr": 0.01})
    return run_id


def test_first_night_has_no_baseline(db_url: str) -> None:
    rng = random.Random(0)
    run_id = nightly_run(db_url, dt.date(2026, 11, 1), {e: 0.7 for e in range(EXAMPLES)}, rng)
    comparison = compare_with_previous(get_engine(db_url), run_id)
    assert comparison.previous_run_id is None and not comparison.regressed


def test_planted_drop_is_flagged(db_url: str) -> None:
    rng = random.Random(1)
    success = {e: 0.7 for e in range(EXAMPLES)}
    first = nightly_run(db_url, dt.date(2026, 11, 1), success, rng)
    dropped = {e: (0.0 if e < 40 else p) for e, p in success.items()}
    second = nightly_run(db_url, dt.date(2026, 11, 2), dropped, rng)
    comparison = compare_with_previous(get_engine(db_url), second)
    assert comparison.previous_run_id == first
    assert comparison.regressed
    assert "noise floor" in comparison.report.summary


def test_sampling_noise_alone_is_not_flagged(db_url: str) -> None:
    rng = random.Random(2)
    success = {e: rng.choice([0.2, 0.5, 0.8]) for e in range(EXAMPLES)}
    nightly_run(db_url, dt.date(2026, 11, 1), success, rng)
    second = nightly_run(db_url, dt.date(2026, 11, 2), success, rng)
    comparison = compare_with_previous(get_engine(db_url), second)
    assert comparison.previous_run_id is not None and not comparison.regressed


def test_other_models_are_not_baselines_and_history_is_per_model(db_url: str) -> None:
    rng = random.Random(3)
    success = {e: 0.7 for e in range(EXAMPLES)}
    nightly_run(db_url, dt.date(2026, 11, 1), success, rng, model="other")
    run_id = nightly_run(db_url, dt.date(2026, 11, 2), success, rng)
    assert compare_with_previous(get_engine(db_url), run_id).previous_run_id is None
    history = nightly_history(get_engine(db_url), "arithmetic")
    assert set(history) == {"arithmetic · other", "arithmetic · m"}
    assert [len(series) for series in history.values()] == [1, 1]
