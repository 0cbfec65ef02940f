"""``vfops runs``: browse, compare and export eval runs in the registry."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Column, Table

from vfops._errors import VfopsError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from vfops.registry import EvalRunRow

app = typer.Typer(help="Browse, compare and export eval runs.", no_args_is_help=True)


def _engine() -> Engine:
    from vfops.registry import get_engine

    return get_engine()


@app.command("list")
def list_command(
    env: Annotated[str | None, typer.Option("--env", help="Only runs of this environment.")] = None,
    limit: Annotated[int, typer.Option(help="How many runs, newest first.")] = 50,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet", "-q", help="Only the runs' full ids, one per line (for RUN=$(...))."
        ),
    ] = False,
) -> None:
    """List eval runs, newest first.

    A run still "running" in the registry whose process is gone (its lease expired, or
    its holder died on this host) shows as "stale": resume it with
    `vfops eval ... --resume RUN`.
    """
    from vfops.registry import RunFilter, list_runs, session_scope

    engine = _engine()
    if quiet:
        with session_scope(engine, write=False) as session:
            for run in list_runs(session, RunFilter(env_name=env, limit=limit)):
                typer.echo(run.id)
        return
    # Readable at 80 columns: what a user copies or compares (the run id prefix that
    # --resume and runs show take, the counts, the reward, when) is never cut; the
    # environment, the model and a long status wrap onto more lines instead.
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0))
    table.add_column("run", no_wrap=True, min_width=12)
    table.add_column("environment", overflow="fold", min_width=11)
    table.add_column("model", overflow="fold", min_width=10)
    table.add_column("status", overflow="fold", min_width=9)
    table.add_column("rollouts", no_wrap=True, justify="right")
    table.add_column("reward", no_wrap=True, justify="right")
    table.add_column("started", no_wrap=True)
    with session_scope(engine, write=False) as session:
        for run in list_runs(session, RunFilter(env_name=env, limit=limit)):
            reward = run.summary.get("reward_mean") if run.summary else None
            table.add_row(
                run.id[:12],
                f"{run.environment_name} {run.environment_version}",
                run.model,
                _status_with_errors(run),
                f"{run.rollouts_stored}/{run.num_examples * run.rollouts_per_example}",
                "-" if reward is None else f"{reward:.3f}",
                run.started_at.strftime("%m-%d %H:%M"),
            )
    Console().print(table)


def _status_with_errors(run: EvalRunRow) -> str:
    """The status, with the run's errored rollouts when it has any: a run whose
    rollouts all failed must not read like a finished one."""
    from vfops.registry import shown_status

    errors = (run.summary or {}).get("errors") or 0
    return f"{shown_status(run)}, {errors} errors" if errors else shown_status(run)


@app.command("show")
def show_command(
    run_id: Annotated[str, typer.Argument(help="Run id or unique prefix.")],
    example: Annotated[
        int | None, typer.Option("--example", help="Whole transcripts of this example_id.")
    ] = None,
    rollout: Annotated[
        int | None,
        typer.Option(
            "--rollout",
            help="Whole transcript of rollout N: the run's N-th rollout (0-based, ordered by "
            "example), or with --example that example's rollout N.",
        ),
    ] = None,
    failed: Annotated[
        bool,
        typer.Option(
            "--failed",
            help="Whole transcripts of rollouts that errored or scored below --pass-threshold.",
        ),
    ] = False,
    pass_threshold: Annotated[
        float, typer.Option(help="With --failed: the reward that counts as a pass.")
    ] = 1.0,
    limit: Annotated[
        int, typer.Option("--limit", "--rollouts", help="How many rollouts to print at most.")
    ] = 3,
) -> None:
    """A run's settings, ids and summary; then a few rollouts, or whole transcripts.

    Without --example, --rollout or --failed: one line per rollout (its last message).
    With them: every message of each selected rollout with its role, the tool calls
    and their results, the expected answer, each reward function's score, the error
    and the token counts.
    """
    from vfops.evaluation import rollout_failed, run_metadata
    from vfops.registry import iter_rollouts, session_scope

    engine = _engine()
    metadata = run_metadata(engine, run_id)
    metadata["status"] = _status_said(engine, metadata["run_id"])
    console = Console()
    console.print(_run_table(metadata))
    # one read transaction while the rollouts stream (pages of batch_size)
    with session_scope(engine, write=False) as session:
        if example is None and rollout is not None and not failed:
            # the run's N-th rollout: the index skips to it, no earlier transcript is read
            one = iter_rollouts(session, metadata["run_id"], batch_size=1, start=rollout)
            chosen_one = list(itertools.islice(one, 1))
            shown = _print_transcripts(
                iter(_with_episode(session, metadata["run_id"], chosen_one)), console
            )
        else:
            records = iter_rollouts(session, metadata["run_id"], batch_size=max(limit, 100))
            if example is None and rollout is None and not failed:
                for record in itertools.islice(records, limit):
                    console.print(_preview(record), markup=False, highlight=False)
                return
            chosen = _select(records, example=example, rollout=rollout, failed=failed,
                             passes=lambda r: not rollout_failed(r, pass_threshold))  # fmt: skip
            shown = _print_transcripts(itertools.islice(chosen, limit), console)
    if not shown:
        raise VfopsError(f"run {metadata['run_id'][:12]}: {_selection(example, rollout, failed)}")


def _status_said(engine: Engine, run_id: str) -> str:
    """The run's status as read now: a stale run says so, and how to finish it."""
    from vfops.registry import STALE, get_run, session_scope, shown_status

    with session_scope(engine, write=False) as session:
        run = get_run(session, run_id, exact=True)
        if run is None:  # removed since it was read
            raise VfopsError(f"no eval run {run_id!r} in the registry; see: vfops runs list")
        status = shown_status(run)
    if status != STALE:
        return status
    return (
        f"{STALE} (still running in the registry, but its process is gone and its lease "
        f"expired; finish it with vfops eval ... --resume {run_id})"
    )


def _with_episode(session: Any, run_id: str, records: list[Any]) -> list[Any]:
    """``records``, each followed by the other traces of its episode (the other agents'
    or attempts'), when it belongs to an episode of several: they read together."""
    from vfops.registry import rollouts_for_example

    shown: list[Any] = []
    for record in records:
        if record.episode is None:
            shown.append(record)
            continue
        siblings = rollouts_for_example(session, run_id, record.example_id)
        shown.append(record)
        shown += [r for r in siblings if r.episode == record.episode and r.key != record.key]
    return shown


def _print_transcripts(records: Iterator[Any], console: Console) -> int:
    from vfops.evaluation import format_transcript

    shown = 0
    for record in records:
        print()
        print(format_transcript(record, width=max(console.width, 60)))
        shown += 1
    return shown


def _run_table(metadata: dict[str, Any]) -> Table:
    # values fold rather than end in "…": ids and folders are copied from here
    table = Table("field", Column("value", overflow="fold"), title=f"run {metadata['run_id']}")
    for key in ("env_name", "env_version", "model", "base_url", "sampling_args", "env_args",
                "num_examples", "rollouts_per_example", "status", "started_at",
                "finished_at", "vfops_version", "tags"):  # fmt: skip
        if metadata.get(key) not in (None, {}, []):
            table.add_row(key, str(metadata[key]))
    table.add_row("mlflow_run_id", metadata["mlflow_run_id"] or "not logged to MLflow")
    if metadata.get("output_dir"):
        table.add_row("output_dir", str(metadata["output_dir"]))
    summary = metadata["summary"] or {}
    for key in ("reward_mean", "reward_stderr", "rollouts", "errors", "truncated"):
        if key in summary:
            value = summary[key]
            table.add_row(key, "none (no rollout was scored)" if value is None else str(value))
    for name, value in (summary.get("metrics") or {}).items():
        table.add_row(f"  {name}", f"{value:.4f}")
    for k, value in (summary.get("pass_at_k") or {}).items():
        table.add_row(f"pass@{k}", f"{value:.4f}")
    return table


def _preview(record: Any) -> str:
    last = record.completion[-1].get("content") if record.completion else ""
    text = " ".join(str(last or "").split())
    error = f" error={record.error.type}: {record.error.message}" if record.error else ""
    episode = (
        f" episode {record.episode} {record.agent or 'trace'}" if record.episode is not None else ""
    )
    return (
        f"example {record.example_id}{episode} #{record.rollout_index} reward={record.reward} "
        f"stop={record.stop_reason}{error}\n  {text[:300]}"
    )


def _select(
    records: Iterator[Any],
    *,
    example: int | None,
    rollout: int | None,
    failed: bool,
    passes: Callable[[Any], bool],
) -> Iterator[Any]:
    position = -1
    for record in records:
        if example is not None and record.example_id != example:
            continue
        position += 1
        if rollout is not None:
            index = record.rollout_index if example is not None else position
            if index != rollout:
                continue
        if failed and passes(record):
            continue
        yield record


def _selection(example: int | None, rollout: int | None, failed: bool) -> str:
    parts = []
    if example is not None:
        parts.append(f"example {example}")
    if rollout is not None:
        parts.append(f"rollout {rollout}")
    what = ", ".join(parts) or "any rollout"
    if failed:
        return f"no failed rollout among {what}; drop --failed to see them all"
    return f"no {what}; see the run's rollouts with: vfops runs show RUN"


@app.command("compare")
def compare_command(
    baseline_arg: Annotated[
        str | None,
        typer.Argument(
            metavar="BASELINE",
            help="The baseline run (id or unique prefix): what the candidate is measured "
            "against. Same as --baseline.",
            show_default=False,
        ),
    ] = None,
    candidate_arg: Annotated[
        str | None,
        typer.Argument(
            metavar="CANDIDATE",
            help="The candidate run: delta = candidate - baseline. Same as --candidate.",
            show_default=False,
        ),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option("--baseline", metavar="RUN", help="The baseline run (id or unique prefix)."),
    ] = None,
    candidate: Annotated[
        str | None,
        typer.Option(
            "--candidate", metavar="RUN", help="The candidate run: delta = candidate - baseline."
        ),
    ] = None,
    latest: Annotated[
        bool,
        typer.Option(
            "--latest",
            help="With --env: the candidate is the environment's newest run, the baseline "
            "the run before it (as runs list orders them).",
        ),
    ] = False,
    env: Annotated[
        str | None,
        typer.Option("--env", metavar="ENV", help="With --latest: whose runs to compare."),
    ] = None,
    pass_threshold: Annotated[float, typer.Option(help="Mean reward that counts as a pass.")] = 1.0,
    show: Annotated[int, typer.Option(help="Flipped examples to list.")] = 10,
) -> None:
    """A candidate run against a baseline: reward deltas aligned on example_id, and which
    examples flipped.

    Name the runs as BASELINE CANDIDATE (in that order), with --baseline RUN
    --candidate RUN, or take an environment's newest run as the candidate and the one
    before it as the baseline with --env ENV --latest. Every delta is candidate -
    baseline: positive means the candidate scored higher. The first line says which run
    is which.
    """
    from vfops.evaluation import compare_runs

    runs = _compared_runs(baseline_arg, candidate_arg, baseline, candidate, latest=latest, env=env)
    engine = _engine()
    base, cand = _resolved_pair(engine, runs, env=env)
    result = compare_runs(engine, base["run_id"], cand["run_id"], pass_threshold=pass_threshold)
    if not result.examples:
        raise VfopsError(
            f"runs {base['run_id'][:12]} and {cand['run_id'][:12]} share no example_id; "
            "nothing to compare"
        )
    # plain echo, not rich: a line is never wrapped at the terminal's width nor read as
    # markup (a model named "x[y]"), so the first line always says which run is which
    typer.echo(f"baseline {_described(base)} vs candidate {_described(cand)}")
    if base["started_at"] > cand["started_at"]:
        # the positional order is easy to get backwards (runs list prints newest first)
        typer.echo(
            "note: the baseline started after the candidate; swap them if you meant to "
            "measure the newer run",
            err=True,
        )
    typer.echo(
        f"{len(result.examples)} shared examples: mean reward delta {result.mean_delta:+.4f} "
        f"(candidate - baseline); flipped to pass {len(result.flipped_to_pass)}, "
        f"to fail {len(result.flipped_to_fail)}; only in baseline {result.only_in_a}, "
        f"only in candidate {result.only_in_b}"
    )
    table = Table("example", "baseline", "candidate", "delta", "flip")
    flips = result.flipped_to_fail + result.flipped_to_pass
    for example in flips[:show]:
        flip = "pass -> fail" if example.passed_a else "fail -> pass"
        table.add_row(
            str(example.example_id),
            f"{example.reward_a:.3f}",
            f"{example.reward_b:.3f}",
            f"{example.delta:+.3f}",
            flip,
        )
    if flips:
        Console().print(table)


_COMPARE_USAGE = (
    "vfops runs compare BASELINE CANDIDATE, --baseline RUN --candidate RUN, or --env ENV --latest"
)


def _compared_runs(
    baseline_arg: str | None,
    candidate_arg: str | None,
    baseline: str | None,
    candidate: str | None,
    *,
    latest: bool,
    env: str | None,
) -> tuple[str, str] | None:
    """The (baseline, candidate) the arguments name, or None for --latest; checked
    before the registry is opened: one way of naming the runs, never a mix."""
    positional = (baseline_arg, candidate_arg)
    named = (baseline, candidate)
    given = [any(x is not None for x in positional), any(x is not None for x in named), latest]
    if sum(given) > 1:
        raise VfopsError(
            "name the runs one way: positional BASELINE CANDIDATE, --baseline/--candidate, "
            f"or --latest, not a mix; use: {_COMPARE_USAGE}"
        )
    if latest:
        if env is None:
            raise VfopsError("--latest needs --env ENV: whose newest two runs to compare")
        return None
    if env is not None:
        raise VfopsError(f"--env goes with --latest only; use: {_COMPARE_USAGE}")
    pair = positional if given[0] else named
    if pair[0] is None or pair[1] is None:
        missing = "baseline" if pair[0] is None else "candidate"
        raise VfopsError(f"no {missing} run given; use: {_COMPARE_USAGE}")
    return pair[0], pair[1]


def _resolved_pair(
    engine: Engine, runs: tuple[str, str] | None, *, env: str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The baseline's and the candidate's metadata (full ids), refusing one run twice."""
    from vfops.evaluation import run_metadata
    from vfops.registry import RunFilter, list_runs, session_scope

    if runs is None:
        with session_scope(engine, write=False) as session:
            newest = [run.id for run in list_runs(session, RunFilter(env_name=env, limit=2))]
        if len(newest) < 2:
            raise VfopsError(
                f"--latest needs two runs of {env!r}, the registry has {len(newest)}; "
                f"see: vfops runs list --env {env}"
            )
        runs = (newest[1], newest[0])
    base, cand = run_metadata(engine, runs[0]), run_metadata(engine, runs[1])
    if base["run_id"] == cand["run_id"]:
        raise VfopsError(
            f"the baseline and the candidate are the same run ({base['run_id'][:12]}); "
            "name two different runs"
        )
    return base, cand


def _described(run: dict[str, Any]) -> str:
    """``<id prefix> (<env> <version>, model <model>, started <minute> UTC)``."""
    started = run["started_at"][:16].replace("T", " ")
    return (
        f"{run['run_id'][:12]} ({run['env_name']} {run['env_version']}, "
        f"model {run['model']}, started {started} UTC)"
    )


@app.command("export")
def export_command(
    run_id: Annotated[str, typer.Argument(help="Run id or unique prefix.")],
    to: Annotated[str, typer.Option("--to", help="Folder or s3://bucket/prefix.")],
) -> None:
    """Export a run as a datasets dataset, a parquet file and metadata.json."""
    from vfops.evaluation import export_run

    print(f"exported to {export_run(_engine(), run_id, to)}")


_COST_GROUPS = ("run", "day", "env", "model")


@app.command("cost")
def cost_command(
    env: Annotated[str | None, typer.Option("--env", help="Only runs of this environment.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Only runs of this model.")] = None,
    since: Annotated[
        str | None,
        typer.Option(help="Only runs started on or after this date (YYYY-MM-DD, UTC)."),
    ] = None,
    by: Annotated[str, typer.Option("--by", help="Group by run, day, env or model.")] = "day",
) -> None:
    """What the runs cost (USD, from endpoint prices), grouped. Unpriced runs say so."""
    import datetime as dt

    from vfops.costs import format_cost
    from vfops.registry import run_costs, session_scope

    if by not in _COST_GROUPS:
        raise VfopsError(f"--by must be one of {', '.join(_COST_GROUPS)}, got {by!r}")
    start = None
    if since is not None:
        try:
            start = dt.datetime.strptime(since, "%Y-%m-%d").replace(tzinfo=dt.UTC)
        except ValueError:
            raise VfopsError(f"--since must be a date like 2026-12-01, got {since!r}") from None
    with session_scope(_engine(), write=False) as session:
        costs = run_costs(session, env_name=env, model=model, since=start)
    if not costs:
        raise VfopsError("no runs match; drop a filter, or list runs with: vfops runs list")
    key_of: dict[str, Callable[[Any], str]] = {
        "run": lambda c: c.run_id[:12],
        "day": lambda c: c.started_at.strftime("%Y-%m-%d"),
        "env": lambda c: c.environment_name,
        "model": lambda c: c.model,
    }
    groups: dict[str, list[Any]] = {}
    for cost in costs:
        groups.setdefault(key_of[by](cost), []).append(cost)
    table = Table(by, "runs", "rollouts", "cost", "unpriced runs")
    total: float | None = None
    for key, members in groups.items():
        priced = [c.cost_usd for c in members if c.cost_usd is not None]
        spent = sum(priced) if priced else None
        if spent is not None:
            total = spent if total is None else total + spent
        table.add_row(
            key,
            str(len(members)),
            str(sum(c.rollouts for c in members)),
            format_cost(spent),
            str(sum(c.cost_usd is None for c in members)),
        )
    table.add_row(
        "total",
        str(len(costs)),
        str(sum(c.rollouts for c in costs)),
        format_cost(total),
        str(sum(c.cost_usd is None for c in costs)),
    )
    Console().print(table)


@app.command("archive")
def archive_command(
    runs: Annotated[
        list[str] | None, typer.Argument(help="Runs (ids or unique prefixes) to archive.")
    ] = None,
    older_than: Annotated[
        float | None,
        typer.Option(
            "--older-than", help="Every completed run that finished more than DAYS days ago."
        ),
    ] = None,
    to: Annotated[
        str | None,
        typer.Option("--to", help="Artifact store (default: VFOPS_ARTIFACTS)."),
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many runs per call.")] = 1000,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List the runs, archive nothing.")
    ] = False,
) -> None:
    """Move completed runs' transcripts to Parquet in the artifact store.

    The registry keeps every rollout's reward, scores, error, usage and cost; the
    prompts and completions go to one Parquet file per run, which runs show, export,
    compare and rescoring read back by themselves.
    """
    import datetime as dt

    from vfops.artifacts import open_store
    from vfops.evaluation import run_metadata
    from vfops.registry import archivable_runs, archive_run_transcripts, session_scope

    if not runs and older_than is None:
        raise VfopsError("name the runs to archive, or give --older-than DAYS (e.g. 30)")
    if older_than is not None and older_than < 0:
        raise VfopsError(f"--older-than must be 0 or more days, got {older_than}")
    engine = _engine()
    chosen = [run_metadata(engine, run)["run_id"] for run in runs or []]
    if older_than is not None:
        before = dt.datetime.now(dt.UTC) - dt.timedelta(days=older_than)
        with session_scope(engine, write=False) as session:
            chosen += archivable_runs(session, finished_before=before, limit=limit)
    chosen = list(dict.fromkeys(chosen))[:limit]
    if dry_run or not chosen:
        for run_id in chosen:
            print(f"would archive {run_id}")
        print(f"{len(chosen)} run(s) to archive" + (" (dry run)" if dry_run else ""))
        return
    total_rollouts = total_bytes = 0
    with open_store(to) as store:
        for run_id in chosen:
            done = archive_run_transcripts(engine, run_id, store)
            total_rollouts += done.rollouts
            total_bytes += done.parquet_bytes
            print(f"archived {run_id}: {done.rollouts} rollouts, {done.parquet_bytes:,} bytes")
    print(f"{len(chosen)} run(s), {total_rollouts} rollouts, {total_bytes:,} bytes of Parquet")
