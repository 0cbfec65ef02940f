"""Rollouts of eval runs: the hot path (Core statements, pre-serialised JSON).

Like every registry function, each takes a :class:`~sqlalchemy.orm.Session` and runs
in the caller's transaction (``with session_scope(engine) as session: ...``;
``write=False`` for reads), so a caller can group a batch with its other writes. The
statements stay Core on the session's connection: no ORM object is built per rollout.
The columns, their order and the row building all come from the rollout schema's
declaration (:data:`vfops._rollout.ROLLOUT_COLUMNS`, via ``ROLLOUT_RECORD_COLUMNS``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Final

import orjson
from sqlalchemy import Text, bindparam, cast, func, select, tuple_, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from vfops._errors import InvalidArgumentError
from vfops._rollout import RolloutRecord, record_builder, row_tuples_builder
from vfops.registry._models import ROLLOUT_RECORD_COLUMNS, Base, EvalRunRow
from vfops.registry._runs import run_model
from vfops.registry._sql import on_conflict_insert
from vfops.registry._transcripts import ArchivedTranscripts

_ROLLOUTS: Final = Base.metadata.tables["rollouts"]
_KEY_COLUMNS: Final = ("run_id", "example_id", "rollout_index")
# The order of the row tuples that insert_rollouts builds (all columns but ``id``).
_INSERT_COLUMNS: Final = ("run_id", *(column.name for column in ROLLOUT_RECORD_COLUMNS))
_JSON_COLUMNS: Final = frozenset(c.name for c in ROLLOUT_RECORD_COLUMNS if c.kind == "json")
# the text columns PostgreSQL must not receive a NUL in (JSON escapes it as \u0000)
_TEXT_POSITIONS: Final = tuple(
    _INSERT_COLUMNS.index(c.name) for c in ROLLOUT_RECORD_COLUMNS if c.kind == "str"
)
_texts_of: Final = itemgetter(*_TEXT_POSITIONS)
_COST_POSITION: Final = _INSERT_COLUMNS.index("cost_usd")
_RECORD_SELECT: Final = tuple(_ROLLOUTS.c[column.name] for column in ROLLOUT_RECORD_COLUMNS)
_insert_sql: dict[str, str] = {}


def _rollout_insert_sql(engine_dialect: Dialect) -> str:
    """The INSERT ... ON CONFLICT DO NOTHING of a rollout row, compiled once per dialect.

    Executed with ``exec_driver_sql`` and positional tuples: SQLAlchemy's per-row
    parameter processing for an ``executemany`` of a compiled statement cost as
    much as SQLite's own work (profiled), and no column here needs a bind
    processor once JSON is serialised by orjson up front.
    """
    dialect_name = engine_dialect.name
    sql = _insert_sql.get(dialect_name)
    if sql is not None:
        return sql
    values: dict[str, Any] = {}
    for name in _INSERT_COLUMNS:
        if name in _JSON_COLUMNS:
            param = bindparam(name, type_=Text())
            values[name] = cast(param, postgresql.JSONB) if dialect_name == "postgresql" else param
        else:
            values[name] = bindparam(name, type_=_ROLLOUTS.c[name].type)
    statement = (
        on_conflict_insert(dialect_name, _ROLLOUTS)
        .values(values)
        .on_conflict_do_nothing(index_elements=list(_KEY_COLUMNS))
    )
    # compile for positional parameters ("?" on SQLite, "%s" on psycopg)
    dialect_class: Any = type(engine_dialect)
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


_sqlite_rows = row_tuples_builder(ROLLOUT_RECORD_COLUMNS, _dumps)
_pg_rows = row_tuples_builder(ROLLOUT_RECORD_COLUMNS, _dumps_pg)


def _without_nul(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(
        value.replace("\x00", "\ufffd") if i in _TEXT_POSITIONS and value is not None else value
        for i, value in enumerate(row)
    )


def _rollout_rows(run_id: str, records: Sequence[RolloutRecord], pg: bool) -> list[tuple[Any, ...]]:
    if not pg:
        return _sqlite_rows(records, run_id)
    rows = _pg_rows(records, run_id)
    for number, row in enumerate(rows):
        # one C-level join of the row's texts (None and "" dropped) beats a generator
        if "\x00" in "".join(filter(None, _texts_of(row))):
            rows[number] = _without_nul(row)
    return rows


def insert_rollouts(session: Session, run_id: str, records: Sequence[RolloutRecord]) -> int:
    """Write a batch of rollouts of a run in the session's transaction; returns how many
    were new.

    A rollout whose (run, example_id, rollout_index) is already stored is skipped,
    so retrying a batch, resuming a run, or two writers racing never duplicate a row.
    ``model`` and ``sampling_args`` are the run's, not stored per rollout.
    """
    if not records:
        return 0
    try:
        # a savepoint: a batch the driver refuses halfway leaves no row behind
        with session.begin_nested():
            return _insert_rollouts(session, run_id, records)
    except (UnicodeEncodeError, orjson.JSONEncodeError):
        # Text UTF-8 cannot encode (a lone surrogate) is refused by orjson, SQLite and
        # psycopg alike; the batch (rolled back) is stored again with it escaped, as
        # results.jsonl has it. Only on that error: the usual batch is not scanned.
        escaped = [record.escaped() for record in records]
        with session.begin_nested():
            return _insert_rollouts(session, run_id, escaped)


def _insert_rollouts(session: Session, run_id: str, records: Sequence[RolloutRecord]) -> int:
    dialect = session.get_bind().dialect
    sql = _rollout_insert_sql(dialect)
    rows = _rollout_rows(run_id, records, pg=dialect.name == "postgresql")
    # preserve_rowcount: psycopg's executemany rowcount is gone once SQLAlchemy
    # closes the cursor, unless captured right after the call
    result = session.connection().exec_driver_sql(
        sql, rows, execution_options={"preserve_rowcount": True}
    )
    inserted = max(result.rowcount, 0)
    if inserted == len(rows):  # the usual batch: every row new, the totals are the batch's
        costs = [row[_COST_POSITION] for row in rows if row[_COST_POSITION] is not None]
        _add_to_run_totals(session, run_id, inserted, len(costs), sum(costs) if costs else None)
    elif inserted:  # some rows were stored already: which ones is the database's to say
        _recount_run_totals(session, run_id)
    return inserted


def _add_to_run_totals(
    session: Session, run_id: str, stored: int, priced: int, cost_usd: float | None
) -> None:
    # relative to the row as stored: writers of one run serialise on its row lock
    values: dict[str, Any] = {
        "rollouts_stored": EvalRunRow.rollouts_stored + stored,
        "rollouts_priced": EvalRunRow.rollouts_priced + priced,
    }
    if cost_usd is not None:  # an unpriced batch leaves an unpriced run's cost None, not 0
        values["cost_usd"] = func.coalesce(EvalRunRow.cost_usd, 0.0) + cost_usd
    session.connection().execute(update(EvalRunRow).where(EvalRunRow.id == run_id).values(values))


def _recount_run_totals(session: Session, run_id: str) -> None:
    totals = session.execute(
        select(
            func.count(), func.count(_ROLLOUTS.c.cost_usd), func.sum(_ROLLOUTS.c.cost_usd)
        ).where(_ROLLOUTS.c.run_id == run_id)
    ).one()
    session.connection().execute(
        update(EvalRunRow)
        .where(EvalRunRow.id == run_id)
        .values(rollouts_stored=totals[0], rollouts_priced=totals[1], cost_usd=totals[2])
    )


def completed_keys(session: Session, run_id: str) -> set[tuple[int, int]]:
    """The (example_id, rollout_index) of every stored rollout of a run."""
    query = select(_ROLLOUTS.c.example_id, _ROLLOUTS.c.rollout_index).where(
        _ROLLOUTS.c.run_id == run_id
    )
    return {(int(example), int(index)) for example, index in session.execute(query)}


def count_rollouts(session: Session, run_id: str) -> int:
    """How many rollouts of a run are stored."""
    query = select(func.count()).select_from(_ROLLOUTS).where(_ROLLOUTS.c.run_id == run_id)
    return int(session.execute(query).scalar_one())


# (row of _RECORD_SELECT, model, sampling_args) -> RolloutRecord; JSON arrives decoded
_to_record = record_builder(ROLLOUT_RECORD_COLUMNS, by_name=False, decode_json=False)


def iter_rollouts(
    session: Session, run_id: str, batch_size: int = 1000, *, start: int = 0
) -> Iterator[RolloutRecord]:
    """Stream a run's rollouts ordered by (example_id, rollout_index), from the
    ``start``-th (0-based).

    Keyset pages of ``batch_size`` rows, each one query in the caller's session (keep
    it open while iterating): memory stays bounded and no server-side cursor is held
    while the caller works through a page. The rollouts before ``start`` are skipped
    in the index, their transcripts never read.
    """
    if batch_size < 1:
        raise InvalidArgumentError(f"batch_size must be at least 1, got {batch_size}")
    if start < 0:
        raise InvalidArgumentError(f"start must be 0 or more, got {start}")
    model, sampling_args = run_model(session, run_id)
    key = tuple_(_ROLLOUTS.c.example_id, _ROLLOUTS.c.rollout_index)
    base = (
        select(*_RECORD_SELECT)
        .where(_ROLLOUTS.c.run_id == run_id)
        .order_by(_ROLLOUTS.c.example_id, _ROLLOUTS.c.rollout_index)
        .limit(batch_size)
    )
    last: tuple[int, int] | None = None
    archive = ArchivedTranscripts(session)
    try:
        while True:
            query = base.offset(start) if last is None else base.where(key > tuple_(*last))
            rows = session.execute(query).all()
            for row in rows:
                yield _built(row, model, sampling_args, run_id, archive)
            if len(rows) < batch_size:
                return
            last = (rows[-1].example_id, rows[-1].rollout_index)
    finally:
        archive.close()


def _built(
    row: Any,
    model: str,
    sampling_args: dict[str, Any],
    run_id: str,
    archive: ArchivedTranscripts,
) -> RolloutRecord:
    record = _to_record(row, model, dict(sampling_args))
    if row.prompt is None:  # its run's transcripts are in the artifact store
        record.prompt, record.completion = archive.get(
            run_id, record.example_id, record.rollout_index
        )
    return record


@dataclass(frozen=True, slots=True)
class RolloutScore:
    """What comparisons read of a rollout: its key, reward, metrics, whether it erred."""

    example_id: int
    rollout_index: int
    reward: float | None
    metrics: dict[str, float]
    errored: bool


def iter_rollout_scores(
    session: Session, run_id: str, batch_size: int = 5000
) -> Iterator[RolloutScore]:
    """Stream a run's scores ordered by (example_id, rollout_index), in keyset pages.

    Reads no transcript: a run's prompts and completions (~10 KB a rollout in a tool
    environment) are never fetched or decoded to compare runs.
    """
    if batch_size < 1:
        raise InvalidArgumentError(f"batch_size must be at least 1, got {batch_size}")
    c = _ROLLOUTS.c
    base = (
        select(c.example_id, c.rollout_index, c.reward, c.metrics, c.error_type)
        .where(c.run_id == run_id)
        .order_by(c.example_id, c.rollout_index)
        .limit(batch_size)
    )
    last: tuple[int, int] | None = None
    while True:
        query = base if last is None else base.where(tuple_(c.example_id, c.rollout_index) > last)
        rows = session.execute(query).all()
        for example_id, index, reward, metrics, error_type in rows:
            yield RolloutScore(example_id, index, reward, metrics or {}, error_type is not None)
        if len(rows) < batch_size:
            return
        last = (rows[-1].example_id, rows[-1].rollout_index)


def rollouts_for_example(session: Session, run_id: str, example_id: int) -> list[RolloutRecord]:
    """The rollouts of one example of a run, by rollout_index."""
    model, sampling_args = run_model(session, run_id)
    query = (
        select(*_RECORD_SELECT)
        .where(_ROLLOUTS.c.run_id == run_id, _ROLLOUTS.c.example_id == example_id)
        .order_by(_ROLLOUTS.c.rollout_index)
    )
    archive = ArchivedTranscripts(session)
    try:
        return [
            _built(row, model, sampling_args, run_id, archive) for row in session.execute(query)
        ]
    finally:
        archive.close()


def add_rollout_cost(
    session: Session, run_id: str, example_id: int, rollout_index: int, usd: float
) -> bool:
    """Add ``usd`` to one stored rollout's cost (a judge's call that re-scored it, made
    after the rollout was written), and to its run's; whether the rollout exists."""
    where = (
        _ROLLOUTS.c.run_id == run_id,
        _ROLLOUTS.c.example_id == example_id,
        _ROLLOUTS.c.rollout_index == rollout_index,
    )
    # locked: a concurrent judge call on the same rollout must see this one's cost
    before = session.execute(
        select(_ROLLOUTS.c.cost_usd).where(*where).with_for_update()
    ).one_or_none()
    if before is None:
        return False
    connection = session.connection()
    connection.execute(
        _ROLLOUTS.update()
        .where(*where)
        .values(cost_usd=func.coalesce(_ROLLOUTS.c.cost_usd, 0.0) + usd)
    )
    _add_to_run_totals(session, run_id, 0, 1 if before[0] is None else 0, usd)
    return True
