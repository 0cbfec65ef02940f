"""Progress bar and summary of ``vfops eval``.

rich is imported only for the progress bar, on a terminal: the summary is plain
aligned text, so a scripted or piped eval does not pay rich's import (~60-100 ms,
most of what separates its last rollout from its exit)."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any

from vfops._rollout import RolloutRecord
from vfops.costs import format_cost
from vfops.evaluation import EvalResult, EvalSummary, OpenedRun
from vfops.tracking import mlflow_run_link

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


class EvalDisplay:
    """A progress bar whose description shows the running reward mean.

    It is the evaluation's progress hook (:class:`vfops.evaluation.EvalProgress`):
    the bar is sized when the run opens, and it remembers the run, so an
    interrupted run can be named with the command that finishes it.
    """

    def __init__(self, *, enabled: bool, total: int | None = None) -> None:
        self.run: OpenedRun | None = None
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if enabled:
            self._progress, self._task = _progress_bar(total)

    def opened(self, run: OpenedRun) -> None:
        self.run = run
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, total=run.planned, completed=run.done)

    def group(self, records: list[RolloutRecord], summary: EvalSummary) -> None:
        self.update(records, summary)

    def update(self, records: list[RolloutRecord], summary: EvalSummary) -> None:
        if self._progress is None or self._task is None:
            return
        errors = f" errors {summary.error_count}" if summary.error_count else ""
        self._progress.update(
            self._task,
            advance=len(records),
            stats=f"reward {_mean(summary)}{errors}",
        )

    def __enter__(self) -> EvalDisplay:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()


def _mean(summary: EvalSummary) -> str:
    return f"{summary.reward.mean:.3f}" if summary.reward.count else "-"


def _progress_bar(total: int | None) -> tuple[Progress, TaskID]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("[bold]eval"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        refresh_per_second=4,  # redraws cost client CPU; 4/s is plenty for a human
    )
    return progress, progress.add_task("eval", total=total, stats="")


def summary_rows(result: EvalResult, took_s: float | None = None) -> list[tuple[str, str]]:
    """The summary as (metric, value) rows, indented names under their group.
    ``took_s``: the process's time so far (what the user waited), shown with the
    rollout phase's; without it, the rollout phase's alone, labelled as such."""
    summary = result.summary
    # no scored rollout has no reward: a 0.0000 would read as a score
    reward = (
        f"{summary.reward.mean:.4f} ± {summary.reward.stderr:.4f} (stderr)"
        if summary.reward.count
        else "none (no rollout was scored)"
    )
    rows = [("reward", reward)]
    rows += [(f"  {name}", f"{mean.mean:.4f}") for name, mean in sorted(summary.metrics.items())]
    # episodes of several agents: each seat's own mean (a zero-sum game's is 0 overall)
    if len(summary.agents) > 1:
        rows += [
            (f"  {name} reward", f"{mean.mean:.4f} ({summary.agent_rollouts[name]} rollouts)")
            for name, mean in sorted(summary.agents.items())
        ]
    rows += [(f"pass@{k}", f"{value:.4f}") for k, value in summary.pass_at().items()]
    rows.append(("rollouts", f"{summary.rollouts} ({summary.reward.count} scored)"))
    rows.append(("errors", str(summary.error_count)))
    rows += [(f"  {kind}", str(count)) for kind, count in sorted(summary.errors.items())]
    if summary.tool_calls:
        rows.append(("tool calls (failed)", f"{summary.tool_calls} ({summary.tool_errors})"))
    rows.append(("truncated", str(summary.truncated_count)))
    rows.append(
        ("tokens (prompt / completion)", f"{summary.prompt_tokens} / {summary.completion_tokens}")
    )
    rows.append(("cost", format_cost(summary.cost_usd)))
    rate = summary.new_rollouts / summary.wall_s if summary.wall_s else 0.0
    phase = f"rollouts {summary.wall_s:.1f} s, {rate:.1f} rollouts/s"
    if took_s is None:
        rows.append(("time", phase))
    else:
        # the whole wait, start-up and recording included; the phase is a part of it
        from vfops._process_clock import process_age_source

        rows.append(("took", f"{took_s:.1f} s since {process_age_source()} ({phase})"))
    return rows


def format_summary(result: EvalResult, took_s: float | None = None) -> str:
    meta: dict[str, Any] = result.metadata
    rows = summary_rows(result, took_s)
    width = max(len(name) for name, _ in rows)
    lines = [f"{meta['env_name']} · {meta['model']}"]
    lines += [f"  {name.ljust(width)}  {value}" for name, value in rows]
    lines += [f"note: {note}" for note in meta.get("notes") or ()]
    warning = result.summary.tool_warning()
    if warning is not None:  # a run whose tools failed must not read as a weak model's
        lines.append(f"warning: {warning}")
    for kind, example in sorted(result.summary.error_examples.items()):
        lines.append(f"{kind}: {example}")  # the cause, unwrapped: greppable and copyable
    if result.run_id is not None:
        lines.append(f"run: {result.run_id} ({result.action})")
    if result.mlflow_run_id is not None:
        lines.append(f"mlflow run: {mlflow_run_link(result.mlflow_run_id)}")
    if result.run_dir is not None:
        lines.append(f"results: {result.run_dir}")
    return "\n".join(lines)


def print_summary(result: EvalResult) -> None:
    """Print the summary; its time is this process's, from its start: the run is
    recorded (registry, files, MLflow) by now, so only the exit is left."""
    from vfops._process_clock import process_age_s

    print(format_summary(result, process_age_s()), flush=True)
