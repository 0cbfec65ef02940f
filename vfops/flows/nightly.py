"""``nightly-eval``: sweep the latest published versions, compare with the previous night.

Deployed on a cron schedule by ``vfops deploy --nightly-config nightly.toml``.
Each cell's run is compared with its previous nightly run, aligned on example_id
(paired bootstrap; McNemar for pass/fail rewards; noise floor measured from the
previous run's own rollouts). Regressions go into a markdown artifact and are
emitted as ``vfops.nightly.regression`` Prefect events an automation can act on.
"""

from __future__ import annotations

from typing import Any, cast

from prefect import flow, get_run_logger, task
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.events import emit_event

from vfops.nightly import CellComparison, NightlyConfig, compare_with_previous, nightly_history
from vfops.registry import get_engine
from vfops.sweeps import Cell, CellResult, run_cell_async, validate_sweep


@task(retries=2, retry_delay_seconds=5, task_run_name="nightly {cell.env_ref} · {cell.endpoint}")
async def run_nightly_cell(cell: Cell) -> dict[str, Any]:
    result: CellResult = await run_cell_async(cell)
    return result.model_dump()


@task
def compare_cell(
    result: dict[str, Any], alpha: float, pass_threshold: float | None
) -> CellComparison:
    label = f"{result['env']}@{result['version']} · {result['model_alias']} · {result['sampling']}"
    return compare_with_previous(
        get_engine(), result["run_id"], label=label, alpha=alpha, pass_threshold=pass_threshold
    )


@task(task_run_name="archive transcripts older than {days:g} days")
def archive_old_transcripts(days: float) -> int:
    import datetime as dt

    from vfops.artifacts import open_store
    from vfops.registry import archive_finished_runs

    before = dt.datetime.now(dt.UTC) - dt.timedelta(days=days)
    with open_store() as store:
        archived = archive_finished_runs(get_engine(), store, finished_before=before)
    get_run_logger().info(
        "archived the transcripts of %d run(s), %d rollouts",
        len(archived),
        sum(run.rollouts for run in archived),
    )
    return len(archived)


@flow(name="nightly-eval")
async def nightly_eval(config: NightlyConfig) -> list[dict[str, Any]]:
    """Sweep the latest versions tonight and flag significant regressions."""
    from vfops.reports import cost_line, nightly_markdown, nightly_table, nightly_trend_chart

    logger = get_run_logger()
    # bad input fails here, before any model call; registry aliases (models:/NAME@champion)
    # are pinned here too: the whole night evaluates whoever held the alias at its start
    cells = validate_sweep(config.sweep())
    pinned = {cell.model_ref: cell.endpoint for cell in cells if cell.model_ref}
    for ref, version in pinned.items():
        logger.info("%s is %s for this night", ref, version)
    futures = [run_nightly_cell.submit(cell) for cell in cells]
    # an async task's future resolves to the coroutine's result, not to a coroutine
    results = [cast(dict[str, Any], future.result()) for future in futures]
    comparisons = [compare_cell(result, config.alpha, config.pass_threshold) for result in results]

    history: dict[str, list[tuple[str, float, float]]] = {}
    aliases = {result["model"]: result["model_alias"] for result in results}
    for env in sorted({result["env"] for result in results}):
        history.update(nightly_history(get_engine(), env, aliases=aliases))
    await acreate_markdown_artifact(
        key="nightly-eval-report",
        markdown=nightly_markdown(
            comparisons,
            nightly_trend_chart(history) if history else None,
            night=config.night().isoformat(),
            pinned=pinned,
            cost=cost_line(results),
        ),
        description="Nightly regressions: trend chart, comparisons, run ids",
    )
    await acreate_table_artifact(
        key="nightly-eval-cells",
        table=nightly_table(list(zip(results, comparisons, strict=True))),
        description="One row per cell: verdict, Δ reward, noise floor (the report has the rest)",
    )
    for comparison in comparisons:
        if comparison.regressed and comparison.report is not None:
            logger.warning("REGRESSION %s: %s", comparison.label, comparison.report.summary)
            emit_event(
                event="vfops.nightly.regression",
                resource={
                    "prefect.resource.id": f"vfops.eval-run.{comparison.run_id}",
                    "prefect.resource.name": comparison.label,
                },
                payload=comparison.to_dict(),
            )
    if config.archive_transcripts_after_days is not None:  # after the comparisons read them
        archive_old_transcripts(config.archive_transcripts_after_days)
    emit_event(
        event="vfops.nightly.completed",
        resource={"prefect.resource.id": f"vfops.nightly.{config.night().isoformat()}"},
        payload={"cells": len(comparisons), "regressions": sum(c.regressed for c in comparisons)},
    )
    return [c.to_dict() for c in comparisons]
