"""Reads and writes of the registry: environments, versions, runs, rollouts, judge cache.

Metadata functions take a :class:`Session`, so a caller can group several into one
transaction (``with session_scope() as session: ...``). Rollout and judge-cache
functions take an :class:`Engine`: they are the hot paths, use Core statements
instead of ORM objects, and each call is its own transaction.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson
from sqlalchemy import (
    Engine,
    Table,
    Text,
    bindparam,
    cast,
    func,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from vfops._errors import VfopsError
from vfops._rollout import RolloutError, RolloutRecord, Timing, TokenUsage
from vfops._version import __version__
from vfops.registry._db import get_engine, transaction
from vfops.registry._models import (
    Base,
    EnvironmentRow,
    EnvironmentVersion,
    EvalRun,
    JudgeCacheRow,
    utcnow,
)

RUN_STATUSES: Final = frozenset({"running", "completed", "failed", "interrupted"})
# a run in any other status can be resumed (its missing rollouts generated)
_FINISHED: Final = "completed"

_SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")


def parse_version(version: str) -> tuple[int, int, int]:
    """``"1.10.0"`` -> ``(1, 10, 0)``; the registry orders versions by these numbers."""
    match = _SEMVER.match(version)
    if match is None:
        raise VfopsError(f"version {version!r} is not MAJOR.MINOR.PATCH (e.g. 0.1.0)")
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def _on_conflict_insert(dialect_name: str, table: Table) -> sqlite.Insert | postgresql.Insert:
    # Both dialects spell "insert or ignore" as INSERT ... ON CONFLICT DO NOTHING.
    if dialect_name == "postgresql":
        return postgresql.insert(table)
    if dialect_name == "sqlite":
        return sqlite.insert(table)
    raise VfopsError(f"unsupported registry database dialect {dialect_name!r}")


def _dialect(session: Session) -> str:
    return session.get_bind().dialect.name


# --- environments ---------------------------------------------------------------------


def get_or_create_environment(session: Session, name: str) -> EnvironmentRow:
    """The environment row named ``name``, inserted if missing (safe under concurrency)."""
    query = select(EnvironmentRow).where(EnvironmentRow.name == name)
    row = session.scalar(query)
    if row is not None:
        return row
    table = Base.metadata.tables["environments"]
    # insert-or-ignore: a concurrent first publish of the same name is not an error
    statement = _on_conflict_insert(_dialect(session), table).values(name=name, created_at=utcnow())
    session.execute(statement.on_conflict_do_nothing(index_elements=["name"]))
    row = session.scalar(query)
    assert row is not None  # inserted above, by us or by the concurrent writer
    return row


def add_environment_version(
    session: Session,
    name: str,
    version: str,
    *,
    content_hash: str,
    code_hash: str,
    wheel_sha256: str,
    sdist_sha256: str,
    wheel_uri: str,
    sdist_uri: str,
    datasets: dict[str, Any] | None = None,
    dependencies: list[Any] | None = None,
    description: str | None = None,
    readme: str | None = None,
) -> EnvironmentVersion:
    """Record a published version. Versions are immutable.

    Re-adding the same version with the same ``content_hash`` returns the existing
    row (a retried publish); with another hash it raises :class:`VfopsError`.
    """
    major, minor, patch = parse_version(version)
    environment = get_or_create_environment(session, name)
    existing = session.scalar(
        select(EnvironmentVersion).where(
            EnvironmentVersion.environment_id == environment.id,
            EnvironmentVersion.version == version,
        )
    )
    if existing is not None:
        if existing.content_hash == content_hash:
            return existing
        raise VfopsError(
            f"{name}@{version} is already published with other content (content hash "
            f"{existing.content_hash[:12]}); versions are immutable: publish a new version"
        )
    row = EnvironmentVersion(
        environment_id=environment.id,
        version=version,
        version_major=major,
        version_minor=minor,
        version_patch=patch,
        content_hash=content_hash,
        code_hash=code_hash,
        wheel_sha256=wheel_sha256,
        sdist_sha256=sdist_sha256,
        wheel_uri=wheel_uri,
        sdist_uri=sdist_uri,
        datasets=dict(datasets or {}),
        dependencies=list(dependencies or []),
        description=description,
        readme=readme,
    )
    row.environment = environment
    session.add(row)
    session.flush()
    return row


def _versions_of(name: str) -> Any:
    # newest first by the numeric semver parts (1.10.0 > 1.9.0), never by the string
    return (
        select(EnvironmentVersion)
        .join(EnvironmentRow)
        .where(EnvironmentRow.name == name)
        .order_by(
            EnvironmentVersion.version_major.desc(),
            EnvironmentVersion.version_minor.desc(),
            EnvironmentVersion.version_patch.desc(),
            EnvironmentVersion.id.desc(),
        )
    )


def find_version(session: Session, name: str, version: str = "latest") -> EnvironmentVersion | None:
    """A published version of ``name``: ``"latest"`` (highest semver) or an exact one."""
    query = _versions_of(name)
    if version != "latest":
        query = query.where(EnvironmentVersion.version == version)
    row: EnvironmentVersion | None = session.scalar(query.limit(1))
    return row


def find_version_by_hash(
    session: Session, name: str, content_hash: str
) -> EnvironmentVersion | None:
    """The highest published version of ``name`` whose source tree has ``content_hash``."""
    query = _versions_of(name).where(EnvironmentVersion.content_hash == content_hash)
    row: EnvironmentVersion | None = session.scalar(query.limit(1))
    return row


def find_version_by_code_hash(
    session: Session, name: str, code_hash: str
) -> EnvironmentVersion | None:
    """The highest published version of ``name`` whose wheel installs code ``code_hash``."""
    query = _versions_of(name).where(EnvironmentVersion.code_hash == code_hash)
    row: EnvironmentVersion | None = session.scalar(query.limit(1))
    return row


def list_environments(session: Session) -> list[EnvironmentRow]:
    """Every environment, by name."""
    return list(session.scalars(select(EnvironmentRow).order_by(EnvironmentRow.name)))


def list_versions(session: Session, name: str) -> list[EnvironmentVersion]:
    """The published versions of ``name``, newest (highest semver) first."""
    return list(session.scalars(_versions_of(name)))


# --- eval runs ------------------------------------------------------------------------


def _check_status(status: str) -> None:
    if status not in RUN_STATUSES:
        raise VfopsError(f"unknown run status {status!r}; use one of {sorted(RUN_STATUSES)}")


def create_run(
    session: Session,
    *,
    environment_name: str,
    environment_version: str,
    environment_content_hash: str,
    model: str,
    num_examples: int,
    rollouts_per_example: int,
    config_fingerprint: str,
    sampling_args: dict[str, Any] | None = None,
    env_args: dict[str, Any] | None = None,
    base_url: str | None = None,
    environment_version_id: int | None = None,
    output_dir: str | None = None,
    run_id: str | None = None,
    status: str = "running",
    tags: Sequence[str] = (),
) -> EvalRun:
    """Insert a new eval run (id: 32 hex characters unless given) and return it."""
    _check_status(status)
    run = EvalRun(
        id=run_id or uuid.uuid4().hex,
        environment_name=environment_name,
        environment_version_id=environment_version_id,
        environment_version=environment_version,
        environment_content_hash=environment_content_hash,
        model=model,
        base_url=base_url,
        sampling_args=dict(sampling_args or {}),
        env_args=dict(env_args or {}),
        num_examples=num_examples,
        rollouts_per_example=rollouts_per_example,
        status=status,
        config_fingerprint=config_fingerprint,
        started_at=utcnow(),
        summary={},
        vfops_version=__version__,
        output_dir=output_dir,
        tags=list(tags),
    )
    session.add(run)
    session.flush()
    return run


def get_run(session: Session, run_id: str) -> EvalRun | None:
    """The run with id ``run_id``, or the only run whose id starts with it.

    Raises :class:`VfopsError` when the prefix matches several runs.
    """
    if not run_id:
        return None
    run = session.get(EvalRun, run_id)
    if run is not None:
        return run
    matches = list(
        session.scalars(
            select(EvalRun).where(EvalRun.id.startswith(run_id, autoescape=True)).limit(2)
        )
    )
    if len(matches) > 1:
        raise VfopsError(f"run id prefix {run_id!r} matches several runs; give more characters")
    return matches[0] if matches else None


def _require_run(session: Session, run_id: str) -> EvalRun:
    run = session.get(EvalRun, run_id)
    if run is None:
        raise VfopsError(f"no eval run with id {run_id!r}")
    return run


def find_resumable_run(session: Session, config_fingerprint: str) -> EvalRun | None:
    """The newest unfinished run with this configuration (status other than completed)."""
    row: EvalRun | None = session.scalar(
        select(EvalRun)
        .where(EvalRun.config_fingerprint == config_fingerprint, EvalRun.status != _FINISHED)
        .order_by(EvalRun.started_at.desc(), EvalRun.id.desc())
        .limit(1)
    )
    return row


def find_completed_run(session: Session, config_fingerprint: str) -> EvalRun | None:
    """The newest completed run with this configuration (a sweep cell reuses it)."""
    row: EvalRun | None = session.scalar(
        select(EvalRun)
        .where(EvalRun.config_fingerprint == config_fingerprint, EvalRun.status == _FINISHED)
        .order_by(EvalRun.started_at.desc(), EvalRun.id.desc())
        .limit(1)
    )
    return row


def list_runs(session: Session, env_name: str | None = None, limit: int = 50) -> list[EvalRun]:
    """The newest runs first, optionally of one environment."""
    query = select(EvalRun).order_by(EvalRun.started_at.desc(), EvalRun.id.desc()).limit(limit)
    if env_name is not None:
        query = query.where(EvalRun.environment_name == env_name)
    return list(session.scalars(query))


def set_run_status(session: Session, run_id: str, status: str) -> EvalRun:
    """Change a run's status (e.g. ``"running"`` again when it is resumed)."""
    _check_status(status)
    run = _require_run(session, run_id)
    run.status = status
    if status == "running":
        run.finished_at = None
    session.flush()
    return run


def finish_run(
    session: Session, run_id: str, status: str, summary: dict[str, Any] | None = None
) -> EvalRun:
    """Set the final status, the summary and ``finished_at`` of a run."""
    _check_status(status)
    run = _require_run(session, run_id)
    run.status = status
    run.summary = dict(summary or {})
    run.finished_at = utcnow()
    session.flush()
    return run


# --- rollouts (hot path: Core, pre-serialised JSON) -------------------------------------

_ROLLOUTS: Final = Base.metadata.tables["rollouts"]
_JSON_COLUMNS: Final = ("prompt", "completion", "info", "metrics")
_TEXT_COLUMNS: Final = ("task", "answer", "error_type", "error_message", "error_stage")
_KEY_COLUMNS: Final = ("run_id", "example_id", "rollout_index")
_RECORD_COLUMNS: Final = tuple(
    column for column in _ROLLOUTS.columns if column.name not in ("id", "run_id")
)
# The order of the row tuples that insert_rollouts builds (all columns but ``id``).
_INSERT_COLUMNS: Final = (
    "run_id",
    "example_id",
    "rollout_index",
    "trace_id",
    "task",
    "prompt",
    "completion",
    "answer",
    "info",
    "reward",
    "metrics",
    "stop_reason",
    "error_type",
    "error_message",
    "error_stage",
    "generation_ms",
    "scoring_ms",
    "prompt_tokens",
    "completion_tokens",
    "turns",
)
_TEXT_POSITIONS: Final = tuple(_INSERT_COLUMNS.index(name) for name in _TEXT_COLUMNS)
_insert_sql: dict[str, str] = {}


def _rollout_insert_sql(engine: Engine) -> str:
    """The INSERT ... ON CONFLICT DO NOTHING of a rollout row, compiled once per dialect.

    Executed with ``exec_driver_sql`` and positional tuples: SQLAlchemy's per-row
    parameter processing for an ``executemany`` of a compiled statement cost as
    much as SQLite's own work (profiled), and no column here needs a bind
    processor once JSON is serialised by orjson up front.
    """
    dialect_name = engine.dialect.name
    sql = _insert_sql.get(dialect_name)
    if sql is not None:
        return sql
    expected = {column.name for column in _ROLLOUTS.columns} - {"id"}
    if set(_INSERT_COLUMNS) != expected:  # _models.py changed: update _INSERT_COLUMNS
        raise RuntimeError(f"rollout columns {sorted(expected)} != {sorted(_INSERT_COLUMNS)}")
    values: dict[str, Any] = {}
    for name in _INSERT_COLUMNS:
        if name in _JSON_COLUMNS:
            param = bindparam(name, type_=Text())
            values[name] = cast(param, postgresql.JSONB) if dialect_name == "postgresql" else param
        else:
            values[name] = bindparam(name, type_=_ROLLOUTS.c[name].type)
    statement = (
        _on_conflict_insert(dialect_name, _ROLLOUTS)
        .values(values)
        .on_conflict_do_nothing(index_elements=list(_KEY_COLUMNS))
    )
    # compile for positional parameters ("?" on SQLite, "%s" on psycopg)
    dialect_class: Any = type(engine.dialect)
    dialect = dialect_class(paramstyle="qmark" if dialect_name == "sqlite" else "format")
    compiled = statement.compile(dialect=dialect)
    if list(compiled.positiontup or ()) != list(_INSERT_COLUMNS):  # pragma: no cover
        raise RuntimeError(f"unexpected parameter order {compiled.positiontup}")
    _insert_sql[dialect_name] = sql = compiled.string
    return sql


def _dumps(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def _strip_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_strip_nul(k): _strip_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strip_nul(item) for item in value]
    return value


def _dumps_pg(value: Any) -> str:
    text = _dumps(value)
    # PostgreSQL refuses NUL in jsonb and text; one stray byte in a model's output
    # must not fail a whole batch, so it becomes U+FFFD (checked on the cheap text).
    if "\\u0000" in text:
        text = _dumps(_strip_nul(value))
    return text


def _rollout_rows(run_id: str, records: Sequence[RolloutRecord], pg: bool) -> list[tuple[Any, ...]]:
    dumps = _dumps_pg if pg else _dumps
    rows: list[tuple[Any, ...]] = []
    append = rows.append
    for record in records:
        error = record.error
        timing, usage = record.timing, record.usage
        append(
            (
                run_id,
                record.example_id,
                record.rollout_index,
                record.trace_id,
                record.task,
                dumps(record.prompt),
                dumps(record.completion),
                record.answer,
                dumps(record.info),
                record.reward,
                dumps(record.metrics),
                record.stop_reason,
                None if error is None else error.type,
                None if error is None else error.message,
                None if error is None else error.stage,
                timing.generation_ms,
                timing.scoring_ms,
                usage.prompt_tokens,
                usage.completion_tokens,
                record.turns,
            )
        )
    if pg:
        for number, row in enumerate(rows):
            if any(row[i] is not None and "\x00" in row[i] for i in _TEXT_POSITIONS):
                rows[number] = tuple(
                    value.replace("\x00", "\ufffd")
                    if i in _TEXT_POSITIONS and value is not None
                    else value
                    for i, value in enumerate(row)
                )
    return rows


def insert_rollouts(engine: Engine, run_id: str, records: Sequence[RolloutRecord]) -> int:
    """Write a batch of rollouts of a run in one transaction; returns how many were new.

    A rollout whose (run, example_id, rollout_index) is already stored is skipped,
    so retrying a batch, resuming a run, or two writers racing never duplicate a row.
    ``model`` and ``sampling_args`` are the run's, not stored per rollout.
    """
    if not records:
        return 0
    sql = _rollout_insert_sql(engine)
    rows = _rollout_rows(run_id, records, pg=engine.dialect.name == "postgresql")
    with transaction(engine) as connection:
        # preserve_rowcount: psycopg's executemany rowcount is gone once SQLAlchemy
        # closes the cursor, unless captured right after the call
        result = connection.exec_driver_sql(
            sql, rows, execution_options={"preserve_rowcount": True}
        )
        return max(result.rowcount, 0)


def completed_keys(engine: Engine, run_id: str) -> set[tuple[int, int]]:
    """The (example_id, rollout_index) of every stored rollout of a run."""
    query = select(_ROLLOUTS.c.example_id, _ROLLOUTS.c.rollout_index).where(
        _ROLLOUTS.c.run_id == run_id
    )
    with transaction(engine, write=False) as connection:
        return {(int(example), int(index)) for example, index in connection.execute(query)}


def count_rollouts(engine: Engine, run_id: str) -> int:
    """How many rollouts of a run are stored."""
    query = select(func.count()).select_from(_ROLLOUTS).where(_ROLLOUTS.c.run_id == run_id)
    with transaction(engine, write=False) as connection:
        return int(connection.execute(query).scalar_one())


def _run_model(engine: Engine, run_id: str) -> tuple[str, dict[str, Any]]:
    with transaction(engine, write=False) as connection:
        row = connection.execute(
            select(EvalRun.model, EvalRun.sampling_args).where(EvalRun.id == run_id)
        ).one_or_none()
    if row is None:
        raise VfopsError(f"no eval run with id {run_id!r}")
    return row[0], row[1]


def _to_record(row: Any, model: str, sampling_args: dict[str, Any]) -> RolloutRecord:
    error = None
    if row.error_type is not None:
        error = RolloutError(type=row.error_type, message=row.error_message, stage=row.error_stage)
    return RolloutRecord(
        example_id=int(row.example_id),
        rollout_index=int(row.rollout_index),
        prompt=row.prompt,
        completion=row.completion,
        answer=row.answer,
        info=row.info,
        task=row.task,
        reward=row.reward,
        metrics=row.metrics,
        stop_reason=row.stop_reason,
        error=error,
        timing=Timing(generation_ms=row.generation_ms, scoring_ms=row.scoring_ms),
        usage=TokenUsage(prompt_tokens=row.prompt_tokens, completion_tokens=row.completion_tokens),
        turns=int(row.turns),
        trace_id=row.trace_id,
        model=model,
        sampling_args=dict(sampling_args),
    )


def iter_rollouts(engine: Engine, run_id: str, batch_size: int = 1000) -> Iterator[RolloutRecord]:
    """Stream a run's rollouts ordered by (example_id, rollout_index).

    Keyset pages of ``batch_size`` rows, each its own short read: memory stays
    bounded and no transaction or server-side cursor is held while the caller
    works through a page. Rows written meanwhile after the cursor are included.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    model, sampling_args = _run_model(engine, run_id)
    key = tuple_(_ROLLOUTS.c.example_id, _ROLLOUTS.c.rollout_index)
    base = (
        select(*_RECORD_COLUMNS)
        .where(_ROLLOUTS.c.run_id == run_id)
        .order_by(_ROLLOUTS.c.example_id, _ROLLOUTS.c.rollout_index)
        .limit(batch_size)
    )
    last: tuple[int, int] | None = None
    while True:
        query = base if last is None else base.where(key > tuple_(*last))
        with transaction(engine, write=False) as connection:
            rows = connection.execute(query).all()
        for row in rows:
            yield _to_record(row, model, sampling_args)
        if len(rows) < batch_size:
            return
        last = (rows[-1].example_id, rows[-1].rollout_index)


def rollouts_for_example(engine: Engine, run_id: str, example_id: int) -> list[RolloutRecord]:
    """The rollouts of one example of a run, by rollout_index."""
    model, sampling_args = _run_model(engine, run_id)
    query = (
        select(*_RECORD_COLUMNS)
        .where(_ROLLOUTS.c.run_id == run_id, _ROLLOUTS.c.example_id == example_id)
        .order_by(_ROLLOUTS.c.rollout_index)
    )
    with transaction(engine, write=False) as connection:
        return [_to_record(row, model, sampling_args) for row in connection.execute(query)]


# --- judge cache ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JudgeCacheEntry:
    """A stored judge verdict: the reply text and, when known, its score."""

    key: str
    response: str
    score: float | None
    judge_model: str


class RegistryJudgeCache:
    """A :class:`vfops.rubrics.JudgeCache` in the registry, shared by runs and processes.

    The database calls run in a worker thread so the event loop never blocks.
    ``set`` is insert-or-ignore: the first verdict for a key stays.
    """

    def __init__(self, engine: Engine | None = None, *, judge_model: str = "") -> None:
        self.engine = engine or get_engine()
        self.judge_model = judge_model
        self._table = Base.metadata.tables["judge_cache"]

    # synchronous forms, for callers outside an event loop
    def get_entry_sync(self, key: str) -> JudgeCacheEntry | None:
        query = select(
            JudgeCacheRow.response, JudgeCacheRow.score, JudgeCacheRow.judge_model
        ).where(JudgeCacheRow.key == key)
        with transaction(self.engine, write=False) as connection:
            row = connection.execute(query).one_or_none()
        if row is None:
            return None
        return JudgeCacheEntry(key=key, response=row[0], score=row[1], judge_model=row[2])

    def set_sync(
        self, key: str, text: str, *, score: float | None = None, judge_model: str | None = None
    ) -> None:
        statement = _on_conflict_insert(self.engine.dialect.name, self._table).values(
            key=key,
            response=text,
            score=score,
            judge_model=self.judge_model if judge_model is None else judge_model,
            created_at=utcnow(),
        )
        with transaction(self.engine) as connection:
            connection.execute(statement.on_conflict_do_nothing(index_elements=["key"]))

    def set_score_sync(self, key: str, score: float | None) -> None:
        with transaction(self.engine) as connection:
            connection.execute(
                update(JudgeCacheRow).where(JudgeCacheRow.key == key).values(score=score)
            )

    # the JudgeCache protocol
    async def get(self, key: str) -> str | None:
        entry = await asyncio.to_thread(self.get_entry_sync, key)
        return None if entry is None else entry.response

    async def set(
        self, key: str, text: str, *, score: float | None = None, judge_model: str | None = None
    ) -> None:
        await asyncio.to_thread(self.set_sync, key, text, score=score, judge_model=judge_model)

    async def get_entry(self, key: str) -> JudgeCacheEntry | None:
        return await asyncio.to_thread(self.get_entry_sync, key)

    async def set_score(self, key: str, score: float | None) -> None:
        """Store the score derived from a cached reply (e.g. 1.0 for "yes")."""
        await asyncio.to_thread(self.set_score_sync, key, score)
