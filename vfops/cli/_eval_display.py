"""Progress bar and summary table of ``vfops eval`` (rich)."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from vfops._rollout import RolloutRecord
from vfops.evaluation import EvalResult, EvalSummary, OpenedRun


class EvalDisplay:
    """A progress bar whose description shows the running reward mean.

    It is the evaluation's progress hook (:class:`vfops.evaluation.EvalProgress`):
    the bar is sized when the run opens, and it remembers the run, so an
    interrupted run can be named with the command that finishes it.
    """

    def __init__(self, *, enabled: bool, total: int | None = None) -> None:
        self.run: OpenedRun | None = None
        self._progress = Progress(
            TextColumn("[bold]eval"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            disable=not enabled,
            refresh_per_second=4,  # redraws cost client CPU; 4/s is plenty for a human
        )
        self._task = self._progress.add_task("eval", total=total, stats="")

    def opened(self, run: OpenedRun) -> None:
        self.run = run
        self._progress.update(self._task, total=run.planned, completed=run.done)

    def group(self, records: list[RolloutRecord], summary: EvalSummary) -> None:
        self.update(records, summary)

    def update(self, records: list[RolloutRecord], summary: EvalSummary) -> None:
        errors = f" errors {summary.error_count}" if summary.error_count else ""
        self._progress.update(
            self._task,
            advance=len(records),
            stats=f"reward {summary.reward.mean:.3f}{errors}",
        )

    def __enter__(self) -> EvalDisplay:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()


def summary_table(result: EvalResult) -> Table:
    summary = result.summary
    meta = result.metadata
    table = Table(title=f"{meta['env_name']} · {meta['model']}", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("reward", f"{summary.reward.mean:.4f} ± {summary.reward.stderr:.4f} (stderr)")
    for name, mean in sorted(summary.metrics.items()):
        table.add_row(f"  {name}", f"{mean.mean:.4f}")
    for k, value in summary.pass_at().items():
        table.add_row(f"pass@{k}", f"{value:.4f}")
    table.add_row("rollouts", f"{summary.rollouts} ({summary.reward.count} scored)")
    table.add_row("errors", str(summary.error_count))
    for kind, count in sorted(summary.errors.items()):
        table.add_row(f"  {kind}", str(count))
    table.add_row("truncated", str(summary.truncated_count))
    table.add_row(
        "tokens (prompt / completion)", f"{summary.prompt_tokens} / {summary.completion_tokens}"
    )
    rate = summary.new_rollouts / summary.wall_s if summary.wall_s else 0.0
    table.add_row("wall time", f"{summary.wall_s:.1f} s ({rate:.1f} rollouts/s)")
    return table


def print_summary(result: EvalResult) -> None:
    console = Console()
    console.print(summary_table(result))
    for kind, example in sorted(result.summary.error_examples.items()):
        # each error kind's cause on one line, unwrapped so it can be grepped and copied
        console.print(f"{kind}: {example}", soft_wrap=True, markup=False, highlight=False)
    if result.run_id is not None:
        console.print(f"run: {result.run_id} ({result.action})")
    if result.mlflow_run_id is not None:
        console.print(f"mlflow run: {result.mlflow_run_id}")
    elif result.mlflow_pending:
        # the tracker process logs it and links the registry run in a moment
        console.print(f"mlflow run: being logged (vfops runs show {result.run_id} links it)")
    if result.run_dir is not None:
        console.print(f"results: {result.run_dir}")
