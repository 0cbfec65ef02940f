"""The registry at a year's size: per-run totals instead of scans, transcripts archived.

Every registry-backed command must cost the same at 1M and 150M rollouts
(bench/registry_scale.py measures it): a run keeps its rollouts' count and cost, kept
by the functions that write rollouts; comparisons read scores without transcripts;
a completed run's transcripts move to Parquet in the artifact store and every reader
gets them back unchanged. On SQLite and PostgreSQL, with a local store and S3 (moto).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text, update

from tests.registry_fixtures import (
    DIALECTS,
    database_url,
    make_error_record,
    make_record,
    store_rollouts,
    stored_for_example,
    stored_rollouts,
)
from vfops.artifacts import open_store
from vfops.registry import (
    EvalRunRow,
    NewRun,
    TranscriptArchiveError,
    add_rollout_cost,
    archivable_runs,
    archive_run_transcripts,
    create_run,
    finish_run,
    get_engine,
    iter_rollout_scores,
    iter_rollouts,
    referenced_artifact_uris,
    run_costs,
    session_scope,
)
from vfops.registry._models import Base

ROLLOUTS = Base.metadata.tables["rollouts"]


@pytest.fixture(params=DIALECTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path)


def _new_run(engine: Any, name: str = "env") -> str:
    with session_scope(engine) as session:
        run = create_run(
            session,
            NewRun(
                environment_name=name,
                environment_version="1.0.0",
                environment_content_hash="0" * 64,
                model="test-model",
                num_examples=4,
                rollouts_per_example=3,
                config_fingerprint=name,
            ),
        )
        return run.id


def _priced(example: int, index: int, usd: float | None) -> Any:
    record = make_record(example, index)
    record.usage.cost_usd = usd
    return record


def _totals(engine: Any, run_id: str) -> tuple[int, int, float | None]:
    with session_scope(engine, write=False) as session:
        run = session.get(EvalRunRow, run_id)
        assert run is not None
        return run.rollouts_stored, run.rollouts_priced, run.cost_usd


def _recounted(engine: Any, run_id: str) -> tuple[int, int, float | None]:
    c = ROLLOUTS.c
    with session_scope(engine, write=False) as session:
        stored, priced, cost = session.execute(
            select(func.count(), func.count(c.cost_usd), func.sum(c.cost_usd)).where(
                c.run_id == run_id
            )
        ).one()
    return int(stored), int(priced), cost


def test_a_runs_totals_follow_every_write(db_url: str) -> None:
    engine = get_engine(db_url)
    run_id = _new_run(engine)
    assert _totals(engine, run_id) == (0, 0, None)
    # unpriced rollouts: counted, and the cost stays unknown (None), not 0
    store_rollouts(engine, run_id, [_priced(0, i, None) for i in range(3)])
    assert _totals(engine, run_id) == (3, 0, None)
    store_rollouts(engine, run_id, [_priced(1, i, 0.25) for i in range(3)])
    assert _totals(engine, run_id) == (6, 3, pytest.approx(0.75))
    # a retried batch overlapping the stored rows: only the new rows count
    store_rollouts(engine, run_id, [_priced(1, 2, 0.25), _priced(2, 0, 0.5)])
    assert _totals(engine, run_id) == (7, 4, pytest.approx(1.25))
    # a judge's cost added later: to an unpriced rollout (now priced) and a priced one
    with session_scope(engine) as session:
        assert add_rollout_cost(session, run_id, 0, 0, 0.125)
        assert add_rollout_cost(session, run_id, 1, 0, 0.125)
        assert not add_rollout_cost(session, run_id, 9, 9, 1.0)
    assert _totals(engine, run_id) == (7, 5, pytest.approx(1.5))
    stored, priced, cost = _recounted(engine, run_id)
    assert (stored, priced) == (7, 5) and cost == pytest.approx(1.5)
    with session_scope(engine, write=False) as session:
        (cost_row,) = run_costs(session, env_name="env")
    assert (cost_row.rollouts, cost_row.priced_rollouts) == (7, 5)
    assert cost_row.cost_usd == pytest.approx(1.5)


def test_scores_are_the_rollouts_without_their_transcripts(db_url: str) -> None:
    engine = get_engine(db_url)
    run_id = _new_run(engine)
    records = [make_record(e, i) for e in range(3) for i in range(2)] + [make_error_record(3, 0)]
    store_rollouts(engine, run_id, records)
    with session_scope(engine, write=False) as session:
        scores = list(iter_rollout_scores(session, run_id, batch_size=2))  # several pages
    assert [(s.example_id, s.rollout_index) for s in scores] == [r.key for r in records]
    assert [s.reward for s in scores] == [r.reward for r in records]
    assert [s.metrics for s in scores] == [r.metrics for r in records]
    assert [s.errored for s in scores] == [r.error is not None for r in records]


def _completed_run(engine: Any, name: str = "env") -> tuple[str, list[Any]]:
    run_id = _new_run(engine, name)
    records = [
        make_record(e, i, completion=[{"role": "assistant", "content": f"turn {e}.{i} " * 40}])
        for e in range(4)
        for i in range(3)
    ]
    store_rollouts(engine, run_id, records)
    with session_scope(engine) as session:
        finish_run(session, run_id, "completed", {"reward_mean": 0.5})
    return run_id, stored_rollouts(engine, run_id)


@pytest.fixture(params=["local", "s3"])
def store_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return (tmp_path / "artifacts").as_uri()
    return str(request.getfixturevalue("s3_uri"))


def test_archived_transcripts_read_back_unchanged(db_url: str, store_uri: str) -> None:
    engine = get_engine(db_url)
    run_id, before = _completed_run(engine)
    with open_store(store_uri) as store:
        done = archive_run_transcripts(engine, run_id, store)
    assert done.rollouts == len(before) and done.parquet_bytes > 0
    with session_scope(engine, write=False) as session:
        left = session.execute(
            select(func.count()).where(ROLLOUTS.c.run_id == run_id, ROLLOUTS.c.prompt.is_not(None))
        ).scalar_one()
        assert left == 0  # the registry holds the summaries only
        assert done.uri in referenced_artifact_uris(session)  # gc keeps the archive
    # every reader gets the same records back: streamed, paged, from an offset, by example
    assert [r.to_dict() for r in stored_rollouts(engine, run_id)] == [r.to_dict() for r in before]
    assert [r.to_dict() for r in stored_rollouts(engine, run_id, batch_size=5)] == [
        r.to_dict() for r in before
    ]
    with session_scope(engine, write=False) as session:
        (seventh,) = list(iter_rollouts(session, run_id, batch_size=1, start=7))[:1]
    assert seventh.to_dict() == before[7].to_dict()
    assert [r.to_dict() for r in stored_for_example(engine, run_id, 2)] == [
        r.to_dict() for r in before if r.example_id == 2
    ]
    with open_store(store_uri) as store, pytest.raises(TranscriptArchiveError, match="already"):
        archive_run_transcripts(engine, run_id, store)


def test_only_completed_runs_are_archived_and_a_failure_changes_nothing(
    db_url: str, tmp_path: Path
) -> None:
    engine = get_engine(db_url)
    run_id, before = _completed_run(engine)
    running = _new_run(engine, "running")
    store_rollouts(engine, running, [make_record(0, 0)])
    store = open_store((tmp_path / "artifacts").as_uri())
    with pytest.raises(TranscriptArchiveError, match="running, not completed"):
        archive_run_transcripts(engine, running, store)
    # the store refuses the upload: the run keeps its transcripts and no URI
    broken = open_store((tmp_path / "artifacts").as_uri())

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError("No space left on device")

    broken.put_file = refuse  # type: ignore[method-assign]
    with pytest.raises(OSError, match="No space"):
        archive_run_transcripts(engine, run_id, broken)
    with session_scope(engine, write=False) as session:
        run = session.get(EvalRunRow, run_id)
        assert run is not None and run.transcripts_uri is None
    assert [r.to_dict() for r in stored_rollouts(engine, run_id)] == [r.to_dict() for r in before]
    # which runs an age-based call picks: completed, unarchived, finished before the cut
    with session_scope(engine) as session:
        session.execute(
            update(EvalRunRow)
            .where(EvalRunRow.id == run_id)
            .values(finished_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
        )
    with session_scope(engine, write=False) as session:
        cut = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
        assert archivable_runs(session, finished_before=cut) == [run_id]
    archive_run_transcripts(engine, run_id, store)
    with session_scope(engine, write=False) as session:
        assert archivable_runs(session, finished_before=cut) == []


def test_vfops_runs_archive_then_show(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "VFOPS_HOME": str(home), "VFOPS_TRACKING": "0", "COLUMNS": "100"}
    env.pop("VFOPS_DATABASE_URL", None)
    env.pop("VFOPS_ARTIFACTS", None)
    engine = get_engine(f"sqlite:///{home / 'registry.db'}")
    run_id, before = _completed_run(engine)

    def vfops(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "vfops", "runs", *args],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    refused = vfops("archive")
    assert refused.returncode == 2
    assert refused.stderr.strip().count("\n") == 0 and "--older-than" in refused.stderr
    archived = vfops("archive", "--older-than", "0")
    assert archived.returncode == 0, archived.stderr
    assert f"archived {run_id}: 12 rollouts" in archived.stdout
    with session_scope(engine, write=False) as session:
        run = session.get(EvalRunRow, run_id)
        assert run is not None and run.transcripts_uri is not None
        assert run.transcripts_uri.startswith((home / "artifacts").as_uri())
        nulls = session.execute(
            text("SELECT count(*) FROM rollouts WHERE prompt IS NULL AND run_id = :r"),
            {"r": run_id},
        ).scalar_one()
    assert nulls == len(before)
    shown = vfops("show", run_id[:10], "--rollout", "7")
    assert shown.returncode == 0, shown.stderr
    assert "turn 2.1 turn 2.1" in shown.stdout  # example 2, rollout 1: the 7th, from Parquet


def test_the_migration_backfills_the_totals_of_runs_stored_before_it(db_url: str) -> None:
    from vfops.registry import downgrade, upgrade

    engine = get_engine(db_url)
    run_id = _new_run(engine)
    store_rollouts(
        engine, run_id, [_priced(e, i, 0.5 if i else None) for e in range(3) for i in range(2)]
    )
    downgrade(db_url, "0005")  # the schema before runs kept totals
    upgrade(db_url)
    assert _totals(engine, run_id) == (6, 3, pytest.approx(1.5))
