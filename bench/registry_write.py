"""Registry write benchmark: ``insert_rollouts`` vs raw ``sqlite3.executemany``.

Writes N rollout rows (default 100,000; ~1 KB of prompt/completion JSON each) in
batches (default 1,000) to two fresh SQLite databases with the registry schema,
interleaving the two writers batch by batch so both see the same machine noise:

- ``insert_rollouts(session, run_id, records)``, one transaction per batch: what
  the eval runner calls; it takes ``RolloutRecord`` objects, so its time includes
  turning them into rows and serialising their JSON;
- raw ``sqlite3``: the same columns and the same pre-serialised values (built
  before the clock starts), ``executemany`` of the same INSERT ... ON CONFLICT DO
  NOTHING, one transaction per batch, same pragmas (WAL, synchronous=NORMAL).

It prints both rates and their ratio (bar: insert_rollouts >= 50 % of raw), then
the PostgreSQL rate of ``insert_rollouts`` (and of raw psycopg ``executemany``
for scale) when PostgreSQL is reachable.

    .venv/bin/python bench/registry_write.py
    .venv/bin/python bench/registry_write.py --rows 20000 --pg-url ''   # quick, no PG
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import string
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from vfops._rollout import RolloutRecord, Timing, TokenUsage
from vfops.registry import (
    NewRun,
    count_rollouts,
    create_run,
    dispose_engines,
    get_engine,
    insert_rollouts,
    session_scope,
)
from vfops.registry._rollouts import _INSERT_COLUMNS


def _insert(engine: Engine, run_id: str, records: list[RolloutRecord]) -> int:
    # what the eval runner's sink does per batch: one write transaction
    with session_scope(engine) as session:
        return insert_rollouts(session, run_id, records)


def _count(engine: Engine, run_id: str) -> int:
    with session_scope(engine, write=False) as session:
        return count_rollouts(session, run_id)


DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
# The same columns, in the same order, as the registry's insert (so the raw baseline
# writes exactly what insert_rollouts writes).
COLUMNS = list(_INSERT_COLUMNS)


def _text(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    size = 0
    while size < chars:
        word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def make_batch(rng: random.Random, start: int, size: int, rollouts: int) -> list[RolloutRecord]:
    """``size`` rollouts: ~1 KB of prompt+completion JSON each, like a math eval."""
    records = []
    for n in range(start, start + size):
        example, index = divmod(n, rollouts)
        records.append(
            RolloutRecord(
                example_id=example,
                rollout_index=index,
                prompt=[
                    {"role": "system", "content": _text(rng, 180)},
                    {"role": "user", "content": _text(rng, 260)},
                ],
                completion=[{"role": "assistant", "content": _text(rng, 520)}],
                answer=str(rng.randint(0, 10_000)),
                info={"split": "eval", "source": "bench", "difficulty": rng.randint(1, 5)},
                task="arithmetic",
                reward=rng.choice((0.0, 1.0)),
                metrics={"correct": rng.choice((0.0, 1.0)), "format": 1.0},
                stop_reason="completed",
                timing=Timing(generation_ms=rng.uniform(50, 900), scoring_ms=rng.uniform(0, 3)),
                usage=TokenUsage(rng.randint(80, 200), rng.randint(50, 300)),
                turns=1,
                model="bench-model",
            )
        )
    return records


def raw_rows(run_id: str, records: list[RolloutRecord]) -> list[tuple[Any, ...]]:
    """The same column values insert_rollouts writes, serialised ahead of time."""

    def dumps(value: Any) -> str:
        return orjson.dumps(value).decode()

    return [
        (
            run_id,
            r.example_id,
            r.rollout_index,
            r.trace_id,
            r.task,
            dumps(r.prompt),
            dumps(r.completion),
            r.answer,
            dumps(r.info),
            r.reward,
            dumps(r.metrics),
            r.stop_reason,
            None,
            None,
            None,
            r.timing.generation_ms,
            r.timing.scoring_ms,
            r.usage.prompt_tokens,
            r.usage.completion_tokens,
            r.turns,
        )
        for r in records
    ]


def new_run(engine: Engine) -> str:
    with session_scope(engine) as session:
        run = create_run(
            session,
            NewRun(
                environment_name="bench",
                environment_version="0.0.0",
                environment_content_hash="0" * 64,
                model="bench-model",
                num_examples=0,
                rollouts_per_example=0,
                config_fingerprint=uuid.uuid4().hex,
            ),
        )
    return run.id


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_sqlite(rows: int, batch: int, workdir: Path) -> tuple[float, float, int]:
    """(insert_rollouts seconds, raw seconds, average JSON bytes per row)."""
    vfops_engine = get_engine(f"sqlite:///{workdir / 'vfops.db'}")
    raw_engine = get_engine(f"sqlite:///{workdir / 'raw.db'}")  # same schema, via migrations
    vfops_run, raw_run = new_run(vfops_engine), new_run(raw_engine)
    raw = sqlite3.connect(workdir / "raw.db", isolation_level=None)
    raw.execute("PRAGMA journal_mode=WAL")
    raw.execute("PRAGMA synchronous=NORMAL")
    raw.execute("PRAGMA foreign_keys=ON")
    insert_sql = (
        f"INSERT INTO rollouts ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) "
        "ON CONFLICT (run_id, example_id, rollout_index) DO NOTHING"
    )
    rng = random.Random(0)
    vfops_s = raw_s = 0.0
    json_bytes = 0
    for start in range(0, rows, batch):
        records = make_batch(rng, start, min(batch, rows - start), rollouts=4)
        values = raw_rows(raw_run, records)
        json_bytes += sum(len(v[5]) + len(v[6]) for v in values)

        def raw_write(values: list[tuple[Any, ...]] = values) -> None:
            raw.execute("BEGIN")
            raw.executemany(insert_sql, values)
            raw.execute("COMMIT")

        # alternate which writer goes first, so neither always meets a fresh checkpoint
        if (start // batch) % 2:
            raw_s += timed(raw_write)
            vfops_s += timed(lambda r=records: _insert(vfops_engine, vfops_run, r))
        else:
            vfops_s += timed(lambda r=records: _insert(vfops_engine, vfops_run, r))
            raw_s += timed(raw_write)
    raw.close()
    assert _count(vfops_engine, vfops_run) == rows
    assert _count(raw_engine, raw_run) == rows
    return vfops_s, raw_s, json_bytes // rows


def bench_postgres(url: str, rows: int, batch: int) -> tuple[float, float] | None:
    """(insert_rollouts seconds, raw psycopg executemany seconds), or None without PG."""
    admin = create_engine(url, poolclass=NullPool)
    schema = f"vfops_bench_{uuid.uuid4().hex[:8]}"
    try:
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    except OperationalError as exc:
        print(f"PostgreSQL: skipped ({url} not reachable: {str(exc.orig).strip()})")
        return None
    schema_url = f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
    try:
        engine = get_engine(schema_url)
        vfops_run, raw_run = new_run(engine), new_run(engine)
        import psycopg

        dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        raw = psycopg.connect(dsn)
        json_columns = {"prompt", "completion", "info", "metrics"}
        placeholders = ", ".join(
            "%s::jsonb" if column in json_columns else "%s" for column in COLUMNS
        )
        insert_sql = (
            f"INSERT INTO rollouts ({', '.join(COLUMNS)}) VALUES ({placeholders}) "
            "ON CONFLICT (run_id, example_id, rollout_index) DO NOTHING"
        )
        rng = random.Random(0)
        vfops_s = raw_s = 0.0
        for start in range(0, rows, batch):
            records = make_batch(rng, start, min(batch, rows - start), rollouts=4)
            values = raw_rows(raw_run, records)

            def raw_write(values: list[tuple[Any, ...]] = values) -> None:
                with raw.transaction(), raw.cursor() as cursor:
                    cursor.executemany(insert_sql, values)

            vfops_s += timed(lambda r=records: _insert(engine, vfops_run, r))
            raw_s += timed(raw_write)
        raw.close()
        assert _count(engine, vfops_run) == rows
        assert _count(engine, raw_run) == rows
        return vfops_s, raw_s
    finally:
        dispose_engines()
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help="'' to skip PostgreSQL")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="vfops-bench-") as tmp:
        vfops_s, raw_s, json_bytes = bench_sqlite(args.rows, args.batch, Path(tmp))
        dispose_engines()
    vfops_rate, raw_rate = args.rows / vfops_s, args.rows / raw_s
    ratio = vfops_rate / raw_rate
    print(
        f"{args.rows:,} rows, batches of {args.batch:,}, "
        f"~{json_bytes:,} bytes of prompt+completion JSON per row"
    )
    print(f"SQLite  insert_rollouts      {vfops_rate:>10,.0f} rows/s  ({vfops_s:6.2f} s)")
    print(f"SQLite  raw executemany      {raw_rate:>10,.0f} rows/s  ({raw_s:6.2f} s)")
    verdict = "PASS" if ratio >= 0.5 else "FAIL"
    print(f"ratio insert_rollouts / raw  {ratio:>10.0%}        (bar >= 50 %: {verdict})")
    if args.pg_url:
        pg = bench_postgres(args.pg_url, args.rows, args.batch)
        if pg is not None:
            pg_vfops_s, pg_raw_s = pg
            print(
                f"PostgreSQL insert_rollouts   {args.rows / pg_vfops_s:>10,.0f} rows/s  "
                f"({pg_vfops_s:6.2f} s)"
            )
            print(
                f"PostgreSQL raw executemany   {args.rows / pg_raw_s:>10,.0f} rows/s  "
                f"({pg_raw_s:6.2f} s)  (psycopg, same rows, for scale)"
            )


if __name__ == "__main__":
    main()
