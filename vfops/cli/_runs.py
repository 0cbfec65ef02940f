"""``vfops runs``: browse, compare and export eval runs in the registry."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from vfops._errors import VfopsError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

app = typer.Typer(help="Browse, compare and export eval runs.", no_args_is_help=True)


def _engine() -> Engine:
    from vfops.registry import get_engine

    return get_engine()


@app.command("list")
def list_command(
    env: Annotated[str | None, typer.Option("--env", help="Only runs of this environment.")] = None,
    limit: Annotated[int, typer.Option(help="How many runs, newest first.")] = 50,
) -> None:
    """List eval runs, newest first."""
    from sqlalchemy.orm import Session

    from vfops.registry import count_rollouts, list_runs

    engine = _engine()
    table = Table(
        "run", "environment", "version", "model", "status", "rollouts", "reward", "started"
    )
    with Session(engine) as session:
        for run in list_runs(session, env_name=env, limit=limit):
            reward = run.summary.get("reward_mean") if run.summary else None
            table.add_row(
                run.id[:12],
                run.environment_name,
                run.environment_version,
                run.model,
                run.status,
                f"{count_rollouts(engine, run.id)}/{run.num_examples * run.rollouts_per_example}",
                "-" if reward is None else f"{reward:.4f}",
                run.started_at.strftime("%Y-%m-%d %H:%M"),
            )
    Console().print(table)


@app.command("show")
def show_command(
    run_id: Annotated[str, typer.Argument(help="Run id or unique prefix.")],
    rollouts: Annotated[int, typer.Option(help="How many rollouts to print.")] = 3,
) -> None:
    """A run's summary and a few of its rollouts."""
    from vfops.evaluation._export import run_metadata
    from vfops.registry import iter_rollouts

    engine = _engine()
    metadata = run_metadata(engine, run_id)
    console = Console()
    table = Table("field", "value", title=f"run {metadata['run_id']}")
    for key in (
        "env_name",
        "env_version",
        "model",
        "status",
        "num_examples",
        "rollouts_per_example",
        "started_at",
        "finished_at",
        "vfops_version",
    ):
        table.add_row(key, str(metadata[key]))
    table.add_row("mlflow_run_id", metadata["mlflow_run_id"] or "not logged to MLflow")
    summary = metadata["summary"] or {}
    for key in ("reward_mean", "reward_stderr", "rollouts", "errors", "truncated"):
        if key in summary:
            table.add_row(key, str(summary[key]))
    for name, value in (summary.get("metrics") or {}).items():
        table.add_row(f"  {name}", f"{value:.4f}")
    for k, value in (summary.get("pass_at_k") or {}).items():
        table.add_row(f"pass@{k}", f"{value:.4f}")
    console.print(table)
    for index, record in enumerate(iter_rollouts(engine, metadata["run_id"], batch_size=rollouts)):
        if index >= rollouts:
            break
        last = record.completion[-1]["content"] if record.completion else ""
        console.print(
            f"[bold]example {record.example_id} #{record.rollout_index}[/] "
            f"reward={record.reward} stop={record.stop_reason}"
            + (f" error={record.error.type}: {record.error.message}" if record.error else "")
        )
        console.print(f"  {str(last)[:300]!r}")


@app.command("compare")
def compare_command(
    run_a: Annotated[str, typer.Argument(help="Baseline run.")],
    run_b: Annotated[str, typer.Argument(help="Candidate run.")],
    pass_threshold: Annotated[float, typer.Option(help="Mean reward that counts as a pass.")] = 1.0,
    show: Annotated[int, typer.Option(help="Flipped examples to list.")] = 10,
) -> None:
    """Reward deltas aligned on example_id, and which examples flipped."""
    from vfops.evaluation._compare import compare_runs
    from vfops.evaluation._export import run_metadata

    engine = _engine()
    a, b = run_metadata(engine, run_a)["run_id"], run_metadata(engine, run_b)["run_id"]
    result = compare_runs(engine, a, b, pass_threshold=pass_threshold)
    if not result.examples:
        raise VfopsError(f"runs {a[:12]} and {b[:12]} share no example_id; nothing to compare")
    console = Console()
    console.print(
        f"{len(result.examples)} shared examples: mean reward delta {result.mean_delta:+.4f} "
        f"(B - A); flipped to pass {len(result.flipped_to_pass)}, "
        f"to fail {len(result.flipped_to_fail)}; only in A {result.only_in_a}, "
        f"only in B {result.only_in_b}"
    )
    table = Table("example", "reward A", "reward B", "delta", "flip")
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
        console.print(table)


@app.command("export")
def export_command(
    run_id: Annotated[str, typer.Argument(help="Run id or unique prefix.")],
    to: Annotated[str, typer.Option("--to", help="Folder or s3://bucket/prefix.")],
) -> None:
    """Export a run as a datasets dataset, a parquet file and metadata.json."""
    from vfops.evaluation._export import export_run

    print(f"exported to {export_run(_engine(), run_id, to)}")
