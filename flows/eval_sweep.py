"""``eval-sweep``: environment refs x endpoint aliases x sampling configs, one task per cell.

A thin layer over :mod:`vfops.sweeps`: the flow validates the whole sweep before
any model call (a bad parameter fails the flow run with one clear line), makes
the worker's environment code match the requested versions, runs the cells as
concurrent tasks with retries, and attaches a table and a markdown artifact.
Each cell resumes or reuses the registry run with the same configuration, so a
retried task or a re-run flow finishes only the missing rollouts.
"""

from __future__ import annotations

import base64
import contextlib
import logging
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_image_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture, as_completed

from vfops.sweeps import (
    Cell,
    SweepSpec,
    output_root,
    prepare_environment,
    run_cell_async,
    sweep_markdown_fallback,
    sweep_table,
    validate_sweep,
)

TABLE_KEY = "eval-sweep-results"
REPORT_KEY = "eval-sweep-report"
CHART_KEY = "eval-sweep-chart"


@task(name="prepare-environment", retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)
def prepare_environment_task(cell: Cell) -> dict[str, Any]:
    """Install the published version a ref asks for when the worker's code differs."""
    prepared = prepare_environment(cell)
    if prepared.note:
        get_run_logger().info(prepared.note)
    return {"env": prepared.env_name, "version": prepared.version, "note": prepared.note}


@task(
    name="run-cell",
    task_run_name="{cell.label}",
    retries=2,
    retry_delay_seconds=[2, 10],
    cache_policy=NO_CACHE,  # the registry is the cache: a cell resumes or reuses its run
)
async def run_cell(
    cell: Cell, output_dir: str, mlflow_parent_run_id: str | None = None
) -> dict[str, Any]:
    """Evaluate one cell (creating, resuming or reusing its registry run)."""
    from pathlib import Path

    from vfops.budget import budget_for, limit_name, prefect_limiter

    # The endpoint's budget (budgets.toml / $VFOPS_BUDGETS) is shared through Prefect
    # global concurrency limits by every flow calling that endpoint, on every worker.
    budget = budget_for(cell.endpoint)
    limiter = None
    if budget.max_concurrent or budget.requests_per_s:
        limiter = await prefect_limiter(
            limit_name("endpoint", cell.endpoint),
            max_concurrent=budget.max_concurrent,
            requests_per_s=budget.requests_per_s,
            concurrency_slots=(
                min(budget.max_concurrent, cell.max_concurrent) if budget.max_concurrent else None
            ),
        )
    try:
        result = await run_cell_async(
            cell,
            output_root=Path(output_dir),
            limiter=limiter,
            mlflow_parent_run_id=mlflow_parent_run_id,
        )
    finally:
        if limiter is not None:
            await limiter.aclose()
    get_run_logger().info(
        "%s: %s run %s, %d rollouts (%d new), reward %s",
        cell.label,
        result.action,
        result.run_id,
        result.rollouts,
        result.new_rollouts,
        "n/a" if result.reward_mean is None else f"{result.reward_mean:.3f}",
    )
    return result.to_json()


def _start_tracking(cells: list[Cell]) -> dict[str, str]:
    """One parent MLflow run per environment of the sweep ({} when tracking is off)."""
    from vfops.tracking import start_sweep_runs, tracking_enabled

    if not tracking_enabled():
        return {}
    from prefect.runtime import flow_run

    name = str(flow_run.get_name() or flow_run.get_id() or "eval-sweep")
    tags = {"prefect.flow_run_id": str(flow_run.get_id() or "")}
    try:
        return start_sweep_runs([c.env_name for c in cells], sweep_name=name, tags=tags)
    except Exception as exc:
        get_run_logger().warning("MLflow tracking is off for this sweep: %s", exc)
        return {}


def _run_cells(
    cells: list[Cell], output_dir: str, parallel: int, parents: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Submit the cells, at most ``parallel`` at a time; failed cells become error rows."""
    outcomes: dict[int, dict[str, Any]] = {}
    running: dict[PrefectFuture[dict[str, Any]], int] = {}
    queue = list(enumerate(cells))

    def collect(future: PrefectFuture[dict[str, Any]]) -> None:
        index = running.pop(future)
        future.wait()  # sets the final state; `state` alone may still read "Running"
        state = future.state
        if state.is_completed():
            outcomes[index] = future.result()
        else:
            cell = cells[index]
            outcomes[index] = {
                "cell": cell.label,
                "env_ref": cell.env_ref,
                "model_alias": cell.endpoint,
                "sampling": cell.sampling.name,
                "status": "failed",
                "error": state.message or state.name or "failed",
            }

    while queue or running:
        while queue and len(running) < parallel:
            index, cell = queue.pop(0)
            parent = (parents or {}).get(cell.env_name)
            running[run_cell.submit(cell, output_dir, parent)] = index
        collect(next(as_completed(list(running))))
    return [outcomes[index] for index in range(len(cells))]


def _chart_and_markdown(results: list[dict[str, Any]]) -> tuple[bytes | None, str]:
    try:
        from vfops.reports import sweep_chart, sweep_markdown
    except ImportError:  # the reports module is optional here
        return None, sweep_markdown_fallback(results)
    completed = [r for r in results if "run_id" in r]
    chart = sweep_chart(completed) if completed else None
    return chart, sweep_markdown(results, chart)


@flow(name="eval-sweep", validate_parameters=True)
def eval_sweep(spec: SweepSpec) -> list[dict[str, Any]]:
    """Evaluate every environment x endpoint x sampling config; one task per cell.

    Args:
        spec: The sweep: environment refs (NAME, NAME@latest, NAME@1.2.3), endpoint aliases,
            sampling configs, N examples and R rollouts per example.
    """
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger] = get_run_logger()
    cells = validate_sweep(spec)  # raises a one-line VfopsError before any model call
    logger.info("sweep of %d cells", len(cells))
    for cell in {c.env_ref: c for c in cells}.values():  # one install per ref, in order
        prepare_environment_task(cell)
    parents = _start_tracking(cells)
    results: list[dict[str, Any]] = []
    try:
        results = _run_cells(cells, str(output_root(spec)), spec.max_parallel_cells, parents)
    finally:
        if parents:
            from vfops.tracking import finish_sweep_runs

            failed = not results or any(r.get("status") == "failed" for r in results)
            with contextlib.suppress(Exception):
                finish_sweep_runs(parents, failed=failed)

    create_table_artifact(
        table=sweep_table(results),
        key=TABLE_KEY,
        description="One row per cell: reward ± stderr, pass@k, errors, tokens, registry run id.",
    )
    chart, markdown = _chart_and_markdown(results)
    if chart is not None:
        data_uri = "data:image/png;base64," + base64.b64encode(chart).decode()
        create_image_artifact(
            image_url=data_uri, key=CHART_KEY, description="Reward per cell (± stderr)."
        )
    create_markdown_artifact(markdown=markdown, key=REPORT_KEY, description="Eval sweep report.")

    failed = [r for r in results if r.get("status") == "failed"]
    if failed:
        first = failed[0]
        raise RuntimeError(
            f"{len(failed)} of {len(results)} cells failed; first: {first['cell']}: "
            f"{first['error']}; re-run the flow to finish them (completed rollouts are kept)"
        )
    return results
