"""The registry at a year's size: fill PostgreSQL with nightly-sweep rollouts, time the
commands users run, the bytes a rollout costs and how fast 1, 4 and 8 writers store.

    .venv/bin/python bench/registry_scale.py                      # 1M then 5M rollouts
    .venv/bin/python bench/registry_scale.py --sizes 100000,500000 --writers 1,2   # quick

The workload is a team's nightly sweep: 50 environments x 4 models, 500 examples x 4
rollouts each (2,000 rollouts a run, 200 runs = 400,000 rollouts a night). 15 of the 50
environments are multi-turn tool environments (~10 KB of transcript per rollout: a
system prompt, a question, four assistant turns with tool calls and their results), the
other 35 single-turn (~1 KB). Text is drawn from a Zipf-distributed vocabulary, so it
compresses like prose; the 4 rollouts of an example share its prompt. 2 % of rollouts
carry an error (no reward), 3 % are truncated, every call is priced.

Everything is written through the project's own write path, as a run writes it:
``create_run``, ``insert_rollouts`` in batches of 500 (one transaction each, what the
eval sink does), ``finish_run`` with the run's summary, by writer processes. Only the
run's start and finish times are then moved back to the night the run emulates (a
real nightly run has them from the clock); nothing else is written by the bench.

At each size it times, as a user runs them (a new process each, start to exit, the
median of ``--repeats`` runs and the first one), ``vfops runs list``, ``runs list --env``,
``runs show RUN``, ``runs show RUN --rollout 1999``, ``runs compare A B``, ``runs cost
--by day`` and two library entry points no CLI command wraps alone: the nightly
regression lookup (``compare_with_previous``: the previous night's run of the cell and
the paired test) and the promotion gate's registry part (the reuse lookup, both runs'
per-example rewards, the paired test). Then it reads the on-disk bytes of the rollouts
table (heap, TOAST, indexes) per rollout. Between the sizes, the fill runs in phases of
1, 4 and 8 concurrent writers and prints each phase's rate.

It creates (and with ``--fresh`` drops first) the database ``--database`` on the
``--pg-url`` server; ``--keep`` leaves it for another look (default: dropped at exit).
"""

from __future__ import annotations

import argparse
import bisect
import datetime as dt
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
ENVS = 50
MULTI_TURN_ENVS = 15
MODELS = 4
EXAMPLES = 500
ROLLOUTS_PER_EXAMPLE = 4
RUN_SIZE = EXAMPLES * ROLLOUTS_PER_EXAMPLE
RUNS_PER_NIGHT = ENVS * MODELS
BATCH = 500
FIRST_NIGHT = dt.date(2026, 1, 1)


# --- the workload -------------------------------------------------------------------


@dataclass(frozen=True)
class RunSpec:
    night: int
    env: int
    model: int

    @property
    def seed(self) -> int:
        return (self.night * 1000 + self.env) * MODELS + self.model

    @property
    def env_name(self) -> str:
        return f"env-{self.env:02d}"

    @property
    def model_name(self) -> str:
        return f"model-{self.model}"

    @property
    def multi_turn(self) -> bool:
        return self.env < MULTI_TURN_ENVS

    @property
    def day(self) -> dt.date:
        return FIRST_NIGHT + dt.timedelta(days=self.night)


def run_specs(start: int, count: int, envs: int = ENVS) -> list[RunSpec]:
    """Runs ``start`` .. ``start + count`` of the sequence night by night (``envs``
    environments x the models a night)."""
    specs = []
    for n in range(start, start + count):
        night, rest = divmod(n, envs * MODELS)
        env, model = divmod(rest, MODELS)
        specs.append(RunSpec(night, env, model))
    return specs


class Prose:
    """Sentences from a Zipf-distributed vocabulary (compresses like English text)."""

    def __init__(self, seed: int = 0, words: int = 6000, sentences: int = 20_000) -> None:
        rng = random.Random(seed)
        syllables = [a + b for a in "bcdfghklmnprstvwz" for b in "aeiou"]
        vocab = sorted(
            {
                "".join(rng.choices(syllables, k=rng.choice((1, 2, 2, 3, 3, 4))))
                for _ in range(words)
            }
        )
        rng.shuffle(vocab)
        cum = list(itertools.accumulate(1.0 / (rank + 1) ** 1.07 for rank in range(len(vocab))))
        total = cum[-1]

        def word() -> str:
            return vocab[bisect.bisect(cum, rng.random() * total)]

        pool = []
        for _ in range(sentences):
            text = " ".join(word() for _ in range(rng.randint(6, 22)))
            pool.append(text[0].upper() + text[1:] + rng.choice(".....?!:"))
        self.pool = pool

    def text(self, rng: random.Random, chars: int) -> str:
        parts: list[str] = []
        size = 0
        while size < chars:
            sentence = self.pool[rng.randrange(len(self.pool))]
            if rng.random() < 0.15:
                sentence += f" {rng.randint(0, 99999)}"
            parts.append(sentence)
            size += len(sentence) + 1
        return " ".join(parts)


def _tool_turns(prose: Prose, rng: random.Random) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for turn in range(4):
        call_id = f"call_{rng.getrandbits(48):012x}"
        arguments = json.dumps({"query": prose.text(rng, 60), "limit": rng.randint(1, 20)})
        messages.append(
            {
                "role": "assistant",
                "content": prose.text(rng, 300),
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": ("search", "read", "run")[turn % 3],
                            "arguments": arguments,
                        },
                    }
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": call_id, "content": prose.text(rng, 1_800)}
        )
    messages.append({"role": "assistant", "content": prose.text(rng, 500)})
    return messages


def run_records(spec: RunSpec, prose: Prose) -> list[Any]:
    """The 2,000 rollouts of one run."""
    from vfops._rollout import RolloutError, RolloutRecord, Timing, TokenUsage

    rng = random.Random(spec.seed)
    system = prose.text(random.Random(spec.env), 250)  # one per environment
    records = []
    for example in range(EXAMPLES):
        question = prose.text(random.Random(spec.env * 1_000_003 + example), 250)
        prompt = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        answer = str(random.Random(example).randint(0, 10_000))
        for index in range(ROLLOUTS_PER_EXAMPLE):
            if spec.multi_turn:
                completion = _tool_turns(prose, rng)
                turns, prompt_tokens, completion_tokens = (
                    5,
                    rng.randint(2500, 4000),
                    rng.randint(600, 1200),
                )
            else:
                completion = [{"role": "assistant", "content": prose.text(rng, 500)}]
                turns, prompt_tokens, completion_tokens = (
                    1,
                    rng.randint(80, 200),
                    rng.randint(50, 300),
                )
            error = None
            draw = rng.random()
            if draw < 0.02:
                error = RolloutError("APITimeoutError", "Request timed out.", "generation")
            correct = float(rng.random() < 0.3 + 0.1 * spec.model + 0.002 * spec.night)
            usage = TokenUsage(prompt_tokens, completion_tokens)
            usage.add_cost(prompt_tokens * 1.5e-7 + completion_tokens * 6e-7)
            records.append(
                RolloutRecord(
                    example_id=example,
                    rollout_index=index,
                    prompt=prompt,
                    completion=completion,
                    answer=answer,
                    info={"split": "eval", "difficulty": example % 5},
                    task=spec.env_name,
                    reward=None if error else correct + 0.2,
                    metrics={} if error else {"correct": correct, "format": 1.0},
                    stop_reason="error" if error else ("length" if draw > 0.97 else "completed"),
                    error=error,
                    timing=Timing(
                        generation_ms=rng.uniform(50, 9000), scoring_ms=rng.uniform(0, 3)
                    ),
                    usage=usage,
                    turns=turns,
                    model=spec.model_name,
                )
            )
    return records


def _summary(records: list[Any]) -> dict[str, Any]:
    rewards = [r.reward for r in records if r.reward is not None]
    mean = statistics.fmean(rewards)
    return {
        "reward_mean": mean,
        "reward_stderr": statistics.pstdev(rewards) / len(rewards) ** 0.5,
        "rollouts": len(records),
        "errors": sum(r.error is not None for r in records),
        "truncated": sum(r.stop_reason == "length" for r in records),
        "metrics": {"correct": statistics.fmean(r.metrics.get("correct", 0.0) for r in records)},
    }


def _write_run(engine: Any, spec: RunSpec, records: list[Any]) -> int:
    """One run through the registry's write path, as an eval run writes it."""
    from sqlalchemy import update

    from vfops.nightly import nightly_tags
    from vfops.registry import NewRun, create_run, finish_run, insert_rollouts, session_scope
    from vfops.registry._models import EvalRunRow

    written = 0
    with session_scope(engine) as session:
        run = create_run(
            session,
            NewRun(
                environment_name=spec.env_name,
                environment_version="1.0.0",
                environment_content_hash=f"{spec.env:064x}",
                model=spec.model_name,
                num_examples=EXAMPLES,
                rollouts_per_example=ROLLOUTS_PER_EXAMPLE,
                config_fingerprint=f"{spec.seed:064x}",
                sampling_args={"temperature": 1.0, "max_tokens": 1024},
                tags=nightly_tags(spec.day),
            ),
        )
        run_id = run.id
    for offset in range(0, len(records), BATCH):
        with session_scope(engine) as session:
            written += insert_rollouts(session, run_id, records[offset : offset + BATCH])
    with session_scope(engine) as session:
        finish_run(session, run_id, "completed", _summary(records))
    started = dt.datetime.combine(spec.day, dt.time(2, 0), dt.UTC) + dt.timedelta(
        seconds=spec.env * MODELS + spec.model
    )
    with session_scope(engine) as session:  # the clock of the night it emulates
        session.execute(
            update(EvalRunRow)
            .where(EvalRunRow.id == run_id)
            .values(started_at=started, finished_at=started + dt.timedelta(minutes=20))
        )
    return written


def write_runs(url: str, specs: list[RunSpec], barrier: Any = None) -> tuple[int, float, float]:
    """One writer process; (rollouts written, start, end) on the wall clock.

    With a ``barrier`` (a rate phase) every run's records are built first and the
    writers start together, so the rate is the database's and the write path's, not
    the text generator's; without one (the fill) each run is built before it is written.
    """
    from vfops.registry import get_engine

    engine = get_engine(url)
    prose = Prose()
    written = 0
    if barrier is not None:
        prepared = [(spec, run_records(spec, prose)) for spec in specs]
        barrier.wait()
        start = time.time()
        for spec, records in prepared:
            written += _write_run(engine, spec, records)
        return written, start, time.time()
    start = time.time()
    for spec in specs:
        written += _write_run(engine, spec, run_records(spec, prose))
    return written, start, time.time()


def fill(
    url: str, start_run: int, runs: int, writers: int, envs: int = ENVS, *, rate: bool = False
) -> float:
    """Write runs ``start_run`` .. ``+runs`` with ``writers`` processes; rollouts/s (with
    ``rate``: from the writers' common start to the last one's end)."""
    specs = run_specs(start_run, runs, envs)
    chunks = [specs[i::writers] for i in range(writers)]
    context = get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(writers, mp_context=context) as pool:
        barrier = manager.Barrier(writers) if rate else None
        began = time.time()
        results = list(pool.map(write_runs, [url] * writers, chunks, [barrier] * writers))
    rollouts = sum(written for written, _, _ in results)
    if rollouts != runs * RUN_SIZE:
        raise SystemExit(f"wrote {rollouts} rollouts, expected {runs * RUN_SIZE}")
    start = min(start for _, start, _ in results) if rate else began
    return rollouts / (max(end for _, _, end in results) - start)


# --- measuring ----------------------------------------------------------------------


def _admin(url: str, sql: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text(sql))
    engine.dispose()


def database_url(admin_url: str, name: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def scalar(url: str, sql: str) -> Any:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.connect() as connection:
        value = connection.execute(text(sql)).scalar()
    engine.dispose()
    return value


def storage(url: str) -> dict[str, float]:
    rows = scalar(url, "SELECT count(*) FROM rollouts")
    sizes = {
        "heap": "pg_relation_size('rollouts')",
        "toast": "pg_relation_size((SELECT reltoastrelid FROM pg_class"
        " WHERE relname = 'rollouts'))",
        "indexes": "pg_indexes_size('rollouts')",
        "total": "pg_total_relation_size('rollouts')",
        "database": "pg_database_size(current_database())",
    }
    figures = {name: float(scalar(url, f"SELECT {sql}")) for name, sql in sizes.items()}
    return {"rows": rows, **{name: value / rows for name, value in figures.items()}}


QUERIES = """
import sys
from vfops.registry import get_engine
kind, a, b = sys.argv[1:4]
engine = get_engine()
if kind == "nightly":
    from vfops.nightly import compare_with_previous
    comparison = compare_with_previous(engine, b)
    assert comparison.previous_run_id == a, (comparison.previous_run_id, a)
    print(comparison.report.regressed)
else:
    from vfops.models._gate import metric_values
    from vfops.registry import RunFilter, get_run, list_runs, session_scope
    from vfops.stats import compare_runs_statistically
    with session_scope(engine, write=False) as session:
        run = get_run(session, b, exact=True)
        # find_reusable_run's lookup (the environment's code hash is the run's here)
        runs = list_runs(session, RunFilter(env_name=run.environment_name, model=run.model,
            status="completed", num_examples=run.num_examples,
            rollouts_per_example=run.rollouts_per_example,
            environment_content_hash=run.environment_content_hash, limit=None))
        assert runs[0].id == b
    report = compare_runs_statistically(metric_values(engine, a, "reward_mean"),
                                        metric_values(engine, b, "reward_mean"))
    print(report.regressed)
"""


def _cell_runs(url: str, env: str, model: str) -> list[str]:
    return [
        row[0]
        for row in rows(
            url,
            f"SELECT id FROM eval_runs WHERE environment_name = '{env}' AND model = '{model}' "
            "ORDER BY started_at",
        )
    ]


def rows(url: str, sql: str) -> list[Any]:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.connect() as connection:
        found = list(connection.execute(text(sql)).all())
    engine.dispose()
    return found


CELL = ("env-00", "model-1")  # a multi-turn environment: ~10 KB per rollout
ARCHIVED_CELL = ("env-01", "model-2")


def commands(url: str) -> dict[str, list[str]]:
    """What is timed: the newest two nights' runs of one cell (and of an archived cell)."""
    *_, run_a, run_b = _cell_runs(url, *CELL)
    old_a, old_b, *_ = _cell_runs(url, *ARCHIVED_CELL)
    vfops = [sys.executable, "-m", "vfops"]
    python = [sys.executable, "-c", QUERIES]
    return {
        "runs list": [*vfops, "runs", "list"],
        "runs list --env": [*vfops, "runs", "list", "--env", CELL[0]],
        "runs show": [*vfops, "runs", "show", run_b],
        "runs show --rollout 1999": [*vfops, "runs", "show", run_b, "--rollout", "1999"],
        "runs compare": [*vfops, "runs", "compare", run_a, run_b],
        "runs cost --by day": [*vfops, "runs", "cost", "--by", "day"],
        "nightly regression lookup": [*python, "nightly", run_a, run_b],
        "promotion gate (registry)": [*python, "gate", run_a, run_b],
        "archived: runs show --rollout 1999": [*vfops, "runs", "show", old_b, "--rollout", "1999"],
        "archived: runs compare": [*vfops, "runs", "compare", old_a, old_b],
    }


def _timed(argv: list[str], env: dict[str, str], code: Path, name: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=code, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{name} failed ({done.returncode}): {done.stderr.strip()[-600:]}")
    return elapsed


def time_commands(
    urls: dict[str, str], repeats: int, code: Path = ROOT
) -> dict[str, dict[str, dict[str, float]]]:
    """Each command on every database, interleaved (a, b, b, a, ...) so the machine's
    load hits all sizes alike: ``{size: {command: {median, min, first}}}``. The first
    round warms the page cache and is reported apart as ``first``."""
    home = tempfile.mkdtemp(prefix="vfops-scale-home-")
    base = {**os.environ, "VFOPS_HOME": home, "COLUMNS": "120", "PYTHONPATH": str(code)}
    envs = {label: {**base, "VFOPS_DATABASE_URL": url} for label, url in urls.items()}
    argvs = {label: commands(url) for label, url in urls.items()}
    labels = list(urls)
    figures: dict[str, dict[str, dict[str, float]]] = {label: {} for label in labels}
    print(f"  {'command':<36}" + "".join(f"{label:>12}" for label in labels), flush=True)
    for name in argvs[labels[0]]:
        times: dict[str, list[float]] = {label: [] for label in labels}
        for round_ in range(repeats + 1):
            for label in labels if round_ % 2 == 0 else labels[::-1]:
                times[label].append(_timed(argvs[label][name], envs[label], code, name))
        for label in labels:
            measured = times[label][1:]
            figures[label][name] = {
                "median": statistics.median(measured),
                "min": min(measured),
                "first": times[label][0],
            }
        print(
            f"  {name:<36}"
            + "".join(f"{figures[label][name]['median']:>11.2f}s" for label in labels),
            flush=True,
        )
    return figures


def archive_cell(url: str, store_uri: str, nights: int = 2) -> None:
    """Archive the first ``nights`` runs of ARCHIVED_CELL (what the archived rows time)."""
    from vfops.artifacts import open_store
    from vfops.registry import archive_run_transcripts, get_engine

    engine = get_engine(url)
    with open_store(store_uri) as store:
        for run_id in _cell_runs(url, *ARCHIVED_CELL)[:nights]:
            archive_run_transcripts(engine, run_id, store)


def archive_night(url: str, store_uri: str, night: int) -> dict[str, float]:
    """Archive a whole night's runs; its rate and what a rollout costs before and after."""
    from vfops.artifacts import open_store
    from vfops.registry import archive_run_transcripts, get_engine

    day = FIRST_NIGHT + dt.timedelta(days=night)
    ids = [
        row[0]
        for row in rows(
            url,
            "SELECT id FROM eval_runs WHERE transcripts_uri IS NULL AND status = 'completed' "
            f"AND started_at >= '{day}' AND started_at < '{day + dt.timedelta(days=1)}'",
        )
    ]
    in_list = ", ".join(f"'{run_id}'" for run_id in ids)
    (transcript,) = rows(
        url,
        "SELECT avg(pg_column_size(prompt) + pg_column_size(completion)), "
        "avg(octet_length(prompt::text) + octet_length(completion::text)) "
        f"FROM rollouts WHERE run_id IN ({in_list})",
    )
    engine = get_engine(url)
    parquet = rollouts = 0
    began = time.perf_counter()
    with open_store(store_uri) as store:
        for run_id in ids:
            done = archive_run_transcripts(engine, run_id, store)
            parquet += done.parquet_bytes
            rollouts += done.rollouts
    wall = time.perf_counter() - began
    (summary,) = rows(
        url, f"SELECT avg(pg_column_size(r.*)) FROM rollouts r WHERE run_id IN ({in_list})"
    )
    return {
        "runs": len(ids),
        "rollouts": rollouts,
        "seconds": wall,
        "rollouts_per_s": rollouts / wall,
        "json_bytes": float(transcript[1]),
        "pg_transcript_bytes": float(transcript[0]),
        "pg_summary_row_bytes": float(summary[0]),
        "parquet_bytes": parquet / rollouts,
    }


# --- main ---------------------------------------------------------------------------


def _print_bytes(size: int, figures: dict[str, float]) -> None:
    print(
        f"  {size:,} rollouts, bytes per rollout: "
        + ", ".join(f"{k} {v:,.0f}" for k, v in figures.items() if k != "rows"),
        flush=True,
    )


def _verdicts(results: dict[str, Any], small: str, large: str) -> bool:
    print(f"\n{'command':<36} {small:>10} {large:>10}  ratio  bar (<= 1.5 s, <= 1.3x)")
    passed = True
    timings = results["commands"]
    for name, small_t in timings[small].items():
        a, b = small_t["median"], timings[large][name]["median"]
        ok = b <= 1.5 and b <= 1.3 * a
        passed &= ok
        print(f"{name:<36} {a:9.2f}s {b:9.2f}s  {b / a:5.2f}  {'ok' if ok else 'FAIL'}")
    return passed


def _extrapolate(results: dict[str, Any], large: str, hot_days: int) -> None:
    per = results["bytes"][large]
    archive = results["archive"]
    year = 150_000_000
    hot = year * hot_days / 365
    summary = archive["pg_summary_row_bytes"] + per["indexes"]
    tiered_pg = hot * per["total"] + (year - hot) * summary
    print(
        f"\n150M rollouts (a year of nightly sweeps): all transcripts in PostgreSQL "
        f"{year * per['total'] / 1e12:.2f} TB; transcripts of the last {hot_days} days in "
        f"PostgreSQL, older ones archived: PostgreSQL {tiered_pg / 1e12:.2f} TB + Parquet "
        f"{(year - hot) * archive['parquet_bytes'] / 1e12:.2f} TB in the artifact store"
    )


def _size_label(size: int) -> str:
    return f"{size / 1e6:g}M" if size >= 1_000_000 else f"{size / 1e3:g}k"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help="a server's admin database URL")
    parser.add_argument("--database", default="vfops_scale")
    parser.add_argument("--sizes", default="1000000,5000000", help="two sizes, in rollouts")
    parser.add_argument("--writers", default="1,4,8", help="writer counts of the rate phases")
    parser.add_argument("--phase-runs", type=int, default=24, help="runs per rate phase")
    parser.add_argument("--fill-writers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each command")
    parser.add_argument(
        "--envs", type=int, default=ENVS, help="environments a night (fewer: quick runs)"
    )
    parser.add_argument("--hot-days", type=int, default=30, help="for the 150M extrapolation")
    parser.add_argument("--keep", action="store_true", help="leave the databases at exit")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument(
        "--time-only",
        action="store_true",
        help="only time the commands again on the databases a --keep run left",
    )
    args = parser.parse_args()
    small, large = (int(size) for size in args.sizes.split(","))
    if small % RUN_SIZE or large % RUN_SIZE or large <= small:
        parser.error(f"--sizes: two increasing multiples of {RUN_SIZE} (one run's rollouts)")
    if small < 2 * args.envs * MODELS * RUN_SIZE:
        parser.error("--sizes: the smaller size must hold two nights (fewer --envs?)")

    sys.path.insert(0, str(ROOT))
    from vfops.registry import dispose_engines, upgrade

    url = database_url(args.pg_url, args.database)
    snapshot = f"{args.database}_{_size_label(small).lower()}"
    small_url = database_url(args.pg_url, snapshot)
    labels = {small: _size_label(small), large: _size_label(large)}
    if args.time_only:
        timed = time_commands({labels[small]: small_url, labels[large]: url}, args.repeats)
        passed = _verdicts({"commands": timed}, labels[small], labels[large])
        print("bars: " + ("met" if passed else "NOT met"))
        return
    for name in (args.database, snapshot):
        _admin(args.pg_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    _admin(args.pg_url, f'CREATE DATABASE "{args.database}"')
    upgrade(url)
    dispose_engines()
    store = Path(tempfile.mkdtemp(prefix="vfops-scale-artifacts-"))
    print(
        f"database {args.database}: schema at head; {args.envs} envs x {MODELS} models a "
        f"night, {EXAMPLES} x {ROLLOUTS_PER_EXAMPLE} rollouts a run, envs 0-"
        f"{MULTI_TURN_ENVS - 1} multi-turn (~10 KB), the others single-turn (~1 KB)",
        flush=True,
    )
    results: dict[str, Any] = {"write_rates": {}, "bytes": {}, "commands": {}}
    try:
        began = time.perf_counter()
        rate = fill(url, 0, small // RUN_SIZE, args.fill_writers, args.envs)
        print(f"filled to {small:,} ({rate:,.0f} rollouts/s, {time.perf_counter() - began:.0f} s)")
        _admin(url, "VACUUM ANALYZE")  # what autovacuum does after a night's writes
        results["bytes"][labels[small]] = storage(url)
        _print_bytes(small, results["bytes"][labels[small]])
        _admin(args.pg_url, f'CREATE DATABASE "{snapshot}" TEMPLATE "{args.database}"')
        written = small // RUN_SIZE
        for writers in (int(w) for w in args.writers.split(",")):
            rate = fill(url, written, args.phase_runs, writers, args.envs, rate=True)
            written += args.phase_runs
            results["write_rates"][writers] = rate
            print(
                f"write rate, {writers} concurrent writer(s): {rate:,.0f} rollouts/s "
                f"({args.phase_runs} runs, table at {written * RUN_SIZE:,})",
                flush=True,
            )
        began = time.perf_counter()
        rate = fill(url, written, large // RUN_SIZE - written, args.fill_writers, args.envs)
        print(f"filled to {large:,} ({rate:,.0f} rollouts/s, {time.perf_counter() - began:.0f} s)")
        _admin(url, "VACUUM ANALYZE")
        results["bytes"][labels[large]] = storage(url)
        _print_bytes(large, results["bytes"][labels[large]])
        for target in (small_url, url):  # the same two runs archived in both
            archive_cell(target, store.as_uri())
        dispose_engines()
        print(f"commands (median of {args.repeats}, process start to exit, interleaved):")
        results["commands"] = time_commands(
            {labels[small]: small_url, labels[large]: url}, args.repeats
        )
        results["archive"] = archive_night(url, store.as_uri(), night=0)
        a = results["archive"]
        print(
            f"\narchive of night 0 ({a['runs']} runs, {a['rollouts']:,} rollouts): "
            f"{a['rollouts_per_s']:,.0f} rollouts/s; per rollout: transcript JSON "
            f"{a['json_bytes']:,.0f} B, in PostgreSQL {a['pg_transcript_bytes']:,.0f} B, as "
            f"Parquet {a['parquet_bytes']:,.0f} B; the summary row left "
            f"{a['pg_summary_row_bytes']:,.0f} B",
            flush=True,
        )
        _extrapolate(results, labels[large], args.hot_days)
        passed = _verdicts(results, labels[small], labels[large])
        print("bars: " + ("met" if passed else "NOT met"))
    finally:
        if args.json:
            args.json.write_text(json.dumps(results, indent=2, default=str))
        dispose_engines()
        if not args.keep:
            for name in (args.database, snapshot):
                _admin(args.pg_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
