"""Registry reads and writes: environments, runs, rollouts, judge cache, alias events.

Every test runs on SQLite (a temporary file) and on PostgreSQL (a fresh schema).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.registry_fixtures import (
    DIALECTS,
    database_url,
    make_error_record,
    make_record,
    store_rollouts,
    stored_count,
    stored_for_example,
    stored_rollouts,
)
from vfops._errors import VfopsError
from vfops._rollout import ROLLOUT_COLUMNS, RolloutError, RolloutRecord
from vfops.registry import (
    AliasEvent,
    EvalRunRow,
    NewEnvironmentVersion,
    NewRun,
    RegistryJudgeCache,
    RolloutRow,
    RunFilter,
    add_environment_version,
    completed_keys,
    count_rollouts,
    create_run,
    find_completed_run,
    find_resumable_run,
    find_version,
    finish_run,
    get_engine,
    get_or_create_environment,
    get_run,
    iter_rollouts,
    list_alias_events,
    list_environments,
    list_runs,
    list_versions,
    record_alias_event,
    session_scope,
    set_run_status,
)
from vfops.registry._models import ARCHIVED_COLUMNS
from vfops.rubrics._judge import JudgeCache


@pytest.fixture(params=DIALECTS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    for url in database_url(request.param, tmp_path):
        yield get_engine(url)


def _publish(engine: Engine, name: str, version: str, content: str = "") -> None:
    with session_scope(engine) as session:
        new = NewEnvironmentVersion(
            name,
            version,
            content_hash=content or f"content-{version}",
            code_hash=f"code-{version}",
            wheel_sha256="w" * 64,
            sdist_sha256="s" * 64,
            wheel_uri=f"file:///artifacts/{name}-{version}.whl",
            sdist_uri=f"file:///artifacts/{name}-{version}.tar.gz",
            datasets={"eval": {"rows": 3}},
            dependencies=["math-verify>=0.7"],
        )
        add_environment_version(session, new)


def _run(
    engine: Engine, fingerprint: str = "fp", env: str = "arith", **kwargs: object
) -> EvalRunRow:
    fields: dict[str, object] = {
        "model": "test-model",
        "sampling_args": {"temperature": 0.7, "max_tokens": 64},
        **kwargs,
    }
    with session_scope(engine) as session:
        new = NewRun(
            environment_name=env,
            environment_version="1.0.0",
            environment_content_hash="c" * 64,
            num_examples=10,
            rollouts_per_example=2,
            config_fingerprint=fingerprint,
            **fields,  # type: ignore[arg-type]
        )
        return create_run(session, new)


# --- environments -----------------------------------------------------------------------


def test_get_or_create_environment_is_idempotent(engine: Engine) -> None:
    with session_scope(engine) as session:
        first = get_or_create_environment(session, "arith")
        again = get_or_create_environment(session, "arith")
    with session_scope(engine) as session:
        later = get_or_create_environment(session, "arith")
        names = [row.name for row in list_environments(session)]
    assert first.id == again.id == later.id
    assert names == ["arith"]


def test_concurrent_get_or_create_environment_makes_one_row(engine: Engine) -> None:
    barrier = threading.Barrier(4)
    ids: list[int] = []
    errors: list[BaseException] = []

    def create() -> None:
        try:
            barrier.wait()
            with session_scope(engine) as session:
                ids.append(get_or_create_environment(session, "race").id)
        except BaseException as exc:  # surfaced in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(set(ids)) == 1
    with session_scope(engine, write=False) as session:
        assert [env.name for env in list_environments(session)] == ["race"]


def test_latest_version_orders_by_semver(engine: Engine) -> None:
    for version in ("1.9.0", "1.10.0", "1.2.0", "0.99.99"):
        _publish(engine, "arith", version)
    _publish(engine, "other", "9.0.0")
    with session_scope(engine, write=False) as session:
        latest = find_version(session, "arith")
        assert latest is not None and latest.version == "1.10.0"
        assert [v.version for v in list_versions(session, "arith")] == [
            "1.10.0",
            "1.9.0",
            "1.2.0",
            "0.99.99",
        ]
        exact = find_version(session, "arith", "1.9.0")
        assert exact is not None and exact.datasets == {"eval": {"rows": 3}}
        assert find_version(session, "arith", "3.0.0") is None
        assert find_version(session, "missing") is None
        assert [env.name for env in list_environments(session)] == ["arith", "other"]


def test_find_version_filters_by_hashes(engine: Engine) -> None:
    _publish(engine, "arith", "1.0.0", content="aaa")
    _publish(engine, "arith", "1.1.0", content="bbb")
    _publish(engine, "arith", "1.2.0", content="bbb")
    _publish(engine, "other", "1.3.0", content="bbb")
    with session_scope(engine, write=False) as session:
        found = find_version(session, "arith", content_hash="bbb")
        assert found is not None and found.version == "1.2.0"  # the highest match
        assert find_version(session, "arith", content_hash="zzz") is None
        by_code = find_version(session, "arith", code_hash="code-1.0.0")
        assert by_code is not None and by_code.version == "1.0.0"
        # every filter given must match
        exact = find_version(session, "arith", "1.1.0", content_hash="bbb")
        assert exact is not None and exact.version == "1.1.0"
        assert find_version(session, "arith", "1.0.0", content_hash="bbb") is None
        assert find_version(session, "arith", code_hash="code-1.2.0", content_hash="aaa") is None


def test_versions_are_immutable(engine: Engine) -> None:
    _publish(engine, "arith", "1.0.0", content="aaa")
    _publish(engine, "arith", "1.0.0", content="aaa")  # a retried publish: no-op
    with pytest.raises(VfopsError, match="immutable"):
        _publish(engine, "arith", "1.0.0", content="changed")
    with pytest.raises(VfopsError, match=r"MAJOR\.MINOR\.PATCH"):
        _publish(engine, "arith", "1.0")
    with session_scope(engine, write=False) as session:
        assert len(list_versions(session, "arith")) == 1


# --- runs -------------------------------------------------------------------------------


def test_create_and_get_run_by_id_and_prefix(engine: Engine) -> None:
    run = _run(engine, run_id="abcdef0123456789abcdef0123456789")
    _run(engine, run_id="abcd99990123456789abcdef01234567")
    with session_scope(engine, write=False) as session:
        found = get_run(session, run.id)
        assert found is not None and found.model == "test-model"
        assert found.sampling_args == {"temperature": 0.7, "max_tokens": 64}
        assert found.status == "running"
        by_prefix = get_run(session, "abcdef")
        assert by_prefix is not None and by_prefix.id == run.id
        assert get_run(session, "ffff") is None
        assert get_run(session, "ab%") is None  # LIKE wildcards are literal
        with pytest.raises(VfopsError, match="several runs"):
            get_run(session, "abcd")


def test_find_resumable_run(engine: Engine) -> None:
    done = _run(engine, fingerprint="same")
    with session_scope(engine) as session:
        finish_run(session, done.id, "completed", {"reward": 1.0})
        assert find_resumable_run(session, "same") is None
    failed = _run(engine, fingerprint="same")
    with session_scope(engine) as session:
        finish_run(session, failed.id, "failed", {})
    with session_scope(engine) as session:
        resumable = find_resumable_run(session, "same")
        assert resumable is not None and resumable.id == failed.id
        assert find_resumable_run(session, "other") is None
        set_run_status(session, failed.id, "running")
    with session_scope(engine, write=False) as session:
        again = get_run(session, failed.id)
        assert again is not None and again.status == "running" and again.finished_at is None


def test_finish_run_and_list_runs(engine: Engine) -> None:
    ids = [_run(engine, env="arith" if i % 2 else "gsm8k").id for i in range(5)]
    with session_scope(engine) as session:
        finished = finish_run(session, ids[0], "completed", {"avg_reward": 0.5})
        assert finished.finished_at is not None
        with pytest.raises(VfopsError, match="unknown run status"):
            set_run_status(session, ids[1], "exploded")
        with pytest.raises(VfopsError, match="no eval run"):
            finish_run(session, "0" * 32, "completed", {})
    with session_scope(engine, write=False) as session:
        runs = list_runs(session)
        assert [run.id for run in runs] == ids[::-1]  # newest first
        assert {run.id for run in list_runs(session, RunFilter(env_name="arith"))} == {
            ids[1],
            ids[3],
        }
        assert len(list_runs(session, RunFilter(limit=2))) == 2
        first = get_run(session, ids[0])
        assert first is not None and first.summary == {"avg_reward": 0.5}
        assert first.status == "completed"


def test_get_run_exact_ignores_prefixes(engine: Engine) -> None:
    run = _run(engine, run_id="abcdef0123456789abcdef0123456789")
    with session_scope(engine, write=False) as session:
        found = get_run(session, run.id, exact=True)
        assert found is not None and found.id == run.id
        assert get_run(session, "abcdef", exact=True) is None


def test_list_runs_filters(engine: Engine) -> None:
    old = _run(engine, fingerprint="fp-a")
    new = _run(engine, fingerprint="fp-a")
    other_model = _run(engine, fingerprint="fp-b", model="other")  # type: ignore[arg-type]
    with session_scope(engine) as session:
        finish_run(session, old.id, "completed", {})
        finish_run(session, new.id, "completed", {})
        assert find_completed_run(session, "fp-b") is None  # running, not completed
        completed = find_completed_run(session, "fp-a")
        assert completed is not None and completed.id == new.id  # the newest
        started = get_run(session, new.id)
        assert started is not None

        def ids(**filters: object) -> list[str]:
            return [run.id for run in list_runs(session, RunFilter(**filters))]  # type: ignore[arg-type]

        assert ids(status="completed") == [new.id, old.id]
        assert ids(model="other") == [other_model.id]
        assert ids(config_fingerprint="fp-a", limit=None) == [new.id, old.id]
        assert ids(num_examples=10, rollouts_per_example=2, limit=1) == [other_model.id]
        assert ids(num_examples=11) == []
        assert ids(environment_content_hash="c" * 64, status="running") == [other_model.id]
        assert ids(started_before=started.started_at) == [old.id]
        assert ids(status="completed", exclude_run_id=new.id) == [old.id]


# --- rollouts ---------------------------------------------------------------------------


def test_rollout_round_trip(engine: Engine) -> None:
    run = _run(engine)
    records = [make_record(1, 0), make_record(1, 1), make_error_record(0, 0)]
    assert store_rollouts(engine, run.id, records) == 3
    # model and sampling_args are the run's; the records above carry the same values
    stored = list(stored_rollouts(engine, run.id))
    assert stored == [records[2], records[0], records[1]]
    assert stored[0].error is not None and stored[0].reward is None
    assert stored_for_example(engine, run.id, 1) == records[:2]
    assert stored_for_example(engine, run.id, 7) == []


def test_insert_rollouts_is_idempotent(engine: Engine) -> None:
    run = _run(engine)
    batch = [make_record(example, index) for example in range(5) for index in range(2)]
    assert store_rollouts(engine, run.id, batch) == 10
    before = list(stored_rollouts(engine, run.id))
    assert store_rollouts(engine, run.id, batch) == 0
    # a retried key never overwrites what was stored first
    changed = [make_record(0, 0, answer="other", reward=0.0)]
    assert store_rollouts(engine, run.id, changed) == 0
    assert list(stored_rollouts(engine, run.id)) == before
    assert stored_count(engine, run.id) == 10
    assert store_rollouts(engine, run.id, []) == 0
    # partly new batch: only the new keys count
    assert store_rollouts(engine, run.id, [make_record(0, 0), make_record(9, 0)]) == 1


def test_completed_keys_and_counts_are_per_run(engine: Engine) -> None:
    first, second = _run(engine), _run(engine)
    store_rollouts(engine, first.id, [make_record(3, 0), make_record(3, 1)])
    store_rollouts(engine, second.id, [make_record(3, 0)])
    with session_scope(engine, write=False) as session:  # one transaction, several reads
        assert completed_keys(session, first.id) == {(3, 0), (3, 1)}
        assert completed_keys(session, second.id) == {(3, 0)}
        assert count_rollouts(session, first.id) == 2
        assert completed_keys(session, "0" * 32) == set()


def test_iter_rollouts_streams_in_key_order_across_pages(engine: Engine) -> None:
    run = _run(engine)
    keys = [(example, index) for example in (10, 2, 33, 7, 1000) for index in (1, 0)]
    store_rollouts(engine, run.id, [make_record(e, i) for e, i in keys])
    for batch_size in (1, 3, 10, 1000):
        with session_scope(engine, write=False) as session:
            pages = iter_rollouts(session, run.id, batch_size=batch_size)
            stored = [r.key for r in pages]
        assert stored == sorted(keys)
    with session_scope(engine, write=False) as session, pytest.raises(VfopsError, match="no eval"):
        next(iter_rollouts(session, "0" * 32))


def test_concurrent_writers_never_duplicate(engine: Engine) -> None:
    run = _run(engine)
    writers, rounds = 4, 6
    barrier = threading.Barrier(writers)
    inserted = [0] * writers
    errors: list[BaseException] = []

    def write(writer: int) -> None:
        try:
            barrier.wait()
            for round_ in range(rounds):
                # overlapping windows: each key is offered by up to three writers
                start = (round_ * 20 + writer * 10) % 100
                batch = [make_record(e, i) for e in range(start, start + 30) for i in (0, 1)]
                inserted[writer] += store_rollouts(engine, run.id, batch)
        except BaseException as exc:  # surfaced in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    with session_scope(engine, write=False) as session:
        keys = completed_keys(session, run.id)
    assert stored_count(engine, run.id) == len(keys)
    assert sum(inserted) == len(keys)
    assert len(list(stored_rollouts(engine, run.id))) == len(keys)


def test_nul_characters_do_not_fail_a_batch(engine: Engine) -> None:
    run = _run(engine)
    record = make_record(
        0,
        0,
        answer="a\x00b",
        completion=[{"role": "assistant", "content": "x\x00y"}],
        info={"k\x00": "v"},
    )
    assert store_rollouts(engine, run.id, [record]) == 1
    (stored,) = stored_rollouts(engine, run.id)
    if engine.dialect.name == "postgresql":  # PostgreSQL cannot store NUL in text or jsonb
        assert stored.answer == "a\ufffdb"
        assert stored.completion[0]["content"] == "x\ufffdy"
        assert stored.info == {"k\ufffd": "v"}
    else:
        assert stored == record


def test_rollouts_table_is_the_rollout_schema() -> None:
    # the table is built from the declaration: every per-rollout column, same nullability
    # (but the transcript columns an archived run clears: see vfops.registry._transcripts)
    table = RolloutRow.__table__
    stored = [c for c in ROLLOUT_COLUMNS if not c.per_run]
    assert [c.name for c in table.columns] == ["id", "run_id", *(c.name for c in stored)]
    assert ARCHIVED_COLUMNS == ("prompt", "completion")
    for spec in stored:
        column = table.c[spec.name]
        assert column.nullable == (spec.nullable or spec.name in ARCHIVED_COLUMNS), spec.name
        assert getattr(column.type, "length", None) == spec.max_length or spec.kind != "str"
    assert {c.name for c in ROLLOUT_COLUMNS if c.per_run} == {"model", "sampling_args"}


def test_nul_in_error_text_does_not_fail_a_batch(engine: Engine) -> None:
    run = _run(engine)
    error = RolloutError(type="ValueError", message="bad \x00 byte", stage="scoring")
    record = make_error_record(0, 0)
    record.error = error
    assert store_rollouts(engine, run.id, [record, make_record(1, 0)]) == 2
    stored, clean = stored_rollouts(engine, run.id)
    assert stored.error is not None
    expected = "bad \ufffd byte" if engine.dialect.name == "postgresql" else "bad \x00 byte"
    assert stored.error.message == expected
    assert clean == make_record(1, 0, trace_id=clean.trace_id)


def test_rollouts_need_an_existing_run(engine: Engine) -> None:
    from sqlalchemy.exc import IntegrityError

    with pytest.raises(IntegrityError):
        store_rollouts(engine, "0" * 32, [make_record(0, 0)])


# --- judge cache -------------------------------------------------------------------------


async def test_judge_cache_get_set(engine: Engine) -> None:
    cache = RegistryJudgeCache(engine, judge_model="judge-1")
    assert isinstance(cache, JudgeCache)
    assert await cache.get("k1") is None
    await cache.set("k1", "yes, correct")
    assert await cache.get("k1") == "yes, correct"
    await cache.set("k1", "no")  # insert-or-ignore: the first verdict stays
    assert await cache.get("k1") == "yes, correct"
    entry = await cache.get_entry("k1")
    assert entry is not None and entry.judge_model == "judge-1" and entry.score is None
    await cache.set_score("k1", 1.0)
    await cache.set("k2", "no", score=0.0, judge_model="judge-2")
    scored = await cache.get_entry("k1")
    assert scored is not None and scored.score == 1.0
    other = await cache.get_entry("k2")
    assert other is not None and (other.score, other.judge_model) == (0.0, "judge-2")
    # another cache object (another process, in practice) sees the same entries
    assert await RegistryJudgeCache(engine).get("k2") == "no"


# --- alias events -------------------------------------------------------------------------


def _decide(engine: Engine, alias: str, to_version: str, outcome: str) -> int:
    with session_scope(engine) as session:
        event = AliasEvent(
            actor="ci",
            model_name="policy",
            alias=alias,
            from_version=None,
            to_version=to_version,
            outcome=outcome,
            forced=False,
            metric="reward",
            evidence={"envs": {"arith": {"delta": 0.1}}},
            reason=f"{outcome} v{to_version}",
        )
        return int(record_alias_event(session, event).id)


def test_alias_events_append_and_list_oldest_first(engine: Engine) -> None:
    first = _decide(engine, "champion", "1", "promoted")
    second = _decide(engine, "staging", "2", "refused")
    third = _decide(engine, "champion", "3", "refused")
    with session_scope(engine, write=False) as session:
        assert [e.id for e in list_alias_events(session, "policy")] == [first, second, third]
        champion = list_alias_events(session, "policy", alias="champion")
        assert [(e.to_version, e.outcome) for e in champion] == [
            ("1", "promoted"),
            ("3", "refused"),
        ]
        assert champion[0].evidence == {"envs": {"arith": {"delta": 0.1}}}
        assert list_alias_events(session, "unknown") == []


def test_records_compare_by_value() -> None:
    # the round-trip tests rely on dataclass equality of nested records
    assert make_record(1, 2, trace_id="t") == make_record(1, 2, trace_id="t")
    assert isinstance(make_record(1, 2), RolloutRecord)


# --- run leases -------------------------------------------------------------------------


def _lease_of(engine: Engine, run_id: str) -> str | None:
    with session_scope(engine, write=False) as session:
        row = get_run(session, run_id)
        assert row is not None
        return row.lease_owner


def _expiry_of(engine: Engine, run_id: str) -> object:
    with session_scope(engine, write=False) as session:
        row = get_run(session, run_id)
        assert row is not None
        return row.lease_expires


def test_a_run_lease_is_held_by_one_owner_until_released_or_expired(engine: Engine) -> None:
    import subprocess
    import sys

    from vfops.registry import (
        LeaseOwner,
        RunBusyError,
        release_run_lease,
        renew_run_lease,
        take_run_lease,
    )

    first, second = LeaseOwner.this_process(), LeaseOwner.this_process()
    run_id = _run(engine, lease_owner=first).id
    assert _lease_of(engine, run_id) == str(first)
    busy = rf"run {run_id} is being worked on by pid \d+"
    with pytest.raises(RunBusyError, match=busy), session_scope(engine) as session:
        take_run_lease(session, run_id, second)
    with session_scope(engine) as session:
        assert renew_run_lease(session, run_id, first)
    with session_scope(engine) as session:
        take_run_lease(session, run_id, first)  # its own lease: taken again (renewed)
        release_run_lease(session, run_id, second)  # not its lease: nothing happens
    assert _lease_of(engine, run_id) == str(first)

    # expired: taken over, and the old owner learns it when it renews
    with session_scope(engine) as session:
        take_run_lease(session, run_id, first, ttl_s=-1)
        take_run_lease(session, run_id, second)
    assert _lease_of(engine, run_id) == str(second)
    with session_scope(engine) as session:
        assert not renew_run_lease(session, run_id, first)

    # a dead process of this host holds it: taken over before it expires
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)  # fmt: skip
    dead = LeaseOwner(first.host, int(finished.stdout), "gone")
    with session_scope(engine) as session:
        release_run_lease(session, run_id, second)
        take_run_lease(session, run_id, dead, ttl_s=3600)
        take_run_lease(session, run_id, first)
    assert _lease_of(engine, run_id) == str(first)
    # another host's process cannot be checked: its lease must expire first
    remote = LeaseOwner("elsewhere.example", 1, "remote")
    with session_scope(engine) as session:
        release_run_lease(session, run_id, first)
        take_run_lease(session, run_id, remote, ttl_s=3600)
    remote_busy = r"pid 1 on host elsewhere\.example"
    with pytest.raises(RunBusyError, match=remote_busy), session_scope(engine) as session:
        take_run_lease(session, run_id, first)
    with session_scope(engine) as session:
        release_run_lease(session, run_id, remote)
    # released: no expiry, the last holder's name kept (a fenced-out holder reads it)
    assert _lease_of(engine, run_id) == str(remote) and _expiry_of(engine, run_id) is None
    with session_scope(engine) as session:
        take_run_lease(session, run_id, second)  # free for anyone
        assert not renew_run_lease(session, run_id, remote)


def test_concurrent_takers_of_one_lease_one_wins(engine: Engine) -> None:
    """The compare-and-set: threads racing for a free lease, exactly one holds it."""
    from vfops.registry import LeaseOwner, RunBusyError, take_run_lease

    run_id = _run(engine).id
    owners = [LeaseOwner.this_process() for _ in range(8)]
    won: list[LeaseOwner] = []
    barrier = threading.Barrier(len(owners))

    def take(owner: LeaseOwner) -> None:
        barrier.wait()
        try:
            with session_scope(engine) as session:
                take_run_lease(session, run_id, owner)
            won.append(owner)
        except RunBusyError:
            pass

    threads = [threading.Thread(target=take, args=(owner,)) for owner in owners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and _lease_of(engine, run_id) == str(won[0])


@pytest.fixture
def pg_engine(tmp_path: Path) -> Iterator[Engine]:
    urls = database_url("postgresql", tmp_path)
    yield get_engine(next(urls))
    next(urls, None)  # drops the schema


def test_a_lease_taken_between_the_read_and_the_write_is_not_overwritten(
    pg_engine: Engine,
) -> None:
    """The compare-and-set, made deterministic: another machine takes the lease just
    before this process's UPDATE runs (PostgreSQL; SQLite's BEGIN IMMEDIATE already
    serialises whole transactions)."""
    import datetime as dt

    from sqlalchemy import event, update

    from vfops.registry import LeaseOwner, RunBusyError, take_run_lease

    run_id = _run(pg_engine).id
    intruder = LeaseOwner("elsewhere.example", 7, "intruder")
    fired: list[bool] = []

    def intrude(conn: object, cursor: object, statement: str, *args: object) -> None:
        if statement.startswith("UPDATE eval_runs SET lease_owner") and not fired:
            fired.append(True)
            with pg_engine.begin() as other:  # another connection: another process
                other.execute(
                    update(EvalRunRow)
                    .where(EvalRunRow.id == run_id)
                    .values(
                        lease_owner=str(intruder),
                        lease_expires=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1),
                    )
                )

    event.listen(pg_engine, "before_cursor_execute", intrude)
    try:
        busy = r"pid 7 on host elsewhere\.example"
        with pytest.raises(RunBusyError, match=busy), session_scope(pg_engine) as session:
            take_run_lease(session, run_id, LeaseOwner.this_process())
    finally:
        event.remove(pg_engine, "before_cursor_execute", intrude)
    assert fired and _lease_of(pg_engine, run_id) == str(intruder)
