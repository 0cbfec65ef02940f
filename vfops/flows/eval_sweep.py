"""``eval-sweep``: environment refs x endpoint aliases x sampling configs, one task per cell.

A thin layer over :mod:`vfops.sweeps`: the flow validates the whole sweep before
any model call (a bad parameter fails the flow run with one clear line), makes
the worker's environment code match the requested versions, runs the cells as
concurrent tasks with retries, and attaches a table artifact (the key columns) and a
markdown report (the chart, the table, and each cell's run id, pass@k, tokens, notes).
Each cell resumes or reuses the registry run with the same configuration, so a
retried task or a re-run flow finishes only the missing rollouts.

With the sweep's ``distribute`` on, each cell is instead its own flow run of the
``eval-sweep-cell`` deployment (the same cell code), taken by any worker of the
pool; the sweep waits for them and builds the same artifacts from the cells'
registry runs. A cell whose worker dies stops heartbeating: the automations of
``vfops deploy`` (vfops.orchestration) crash it and schedule it again, and the
next worker resumes its registry run.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, cast

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture, as_completed

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

from vfops._errors import VfopsError
from vfops.orchestration import SANDBOX_LIMIT, FanOut, PrefectFleetGate, fan_out, flow_run_link
from vfops.sandbox import fleet_gate_scope
from vfops.sweeps import (
    Cell,
    SweepSpec,
    cell_result_from_registry,
    output_root,
    prepare_environment,
    run_cell_async,
    run_of_flow_run,
    sweep_markdown_fallback,
    sweep_table,
    validate_sweep,
    worker_name,
)

TABLE_KEY = "eval-sweep-results"
REPORT_KEY = "eval-sweep-report"

CELL_FLOW = "eval-sweep-cell"
CELL_DEPLOYMENT = f"{CELL_FLOW}/{CELL_FLOW}"
"""The deployment ``vfops deploy`` registers for the cells of a distributed sweep."""
CELL_RETRIES = 2
"""Retries of a cell that raised (task or flow run alike), each resuming its run."""
MAX_CELL_RUNS = 6
"""Starts of one cell flow run, over its retries and its reschedules after lost workers;
past it the cell fails instead of starting again."""
CRASHED_GRACE_S = 180.0
"""How long the sweep waits on a Crashed cell run before counting it failed: the reschedule
automation moves a crashed cell back to Scheduled within seconds."""
POLL_S = 2.0


@task(name="prepare-environment", retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)
def prepare_environment_task(cell: Cell) -> dict[str, Any]:
    """Install the published version a ref asks for when the worker's code differs."""
    prepared = prepare_environment(cell)
    if prepared.note:
        get_run_logger().info(prepared.note)
    return {"env": prepared.env_name, "version": prepared.version, "note": prepared.note}


async def _evaluate_cell(
    cell: Cell, output_dir: str, mlflow_parent_run_id: str | None = None
) -> dict[str, Any]:
    """Evaluate one cell (creating, resuming or reusing its registry run): the one body of
    both the ``run-cell`` task and the ``eval-sweep-cell`` flow."""
    from pathlib import Path

    from prefect.runtime import flow_run

    from vfops.budget import budget_for, limit_name
    from vfops.orchestration import prefect_limiter
    from vfops.tracking import mlflow_run_link

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
    # each sandbox container of the cell holds a slot of the fleet's limit too
    gate = PrefectFleetGate(SANDBOX_LIMIT, limit=cell.max_sandboxes)
    try:
        with fleet_gate_scope(gate):
            result = await run_cell_async(
                cell,
                output_root=Path(output_dir),
                limiter=limiter,
                mlflow_parent_run_id=mlflow_parent_run_id,
                flow_run_id=str(flow_run.get_id() or "") or None,
            )
    finally:
        if limiter is not None:
            await limiter.aclose()
    get_run_logger().info(
        "%s: %s run %s on worker %s, %d rollouts (%s new), reward %s, MLflow run %s",
        cell.label,
        result.action,
        result.run_id,
        worker_name(),
        result.rollouts,
        result.new_rollouts,
        "n/a" if result.reward_mean is None else f"{result.reward_mean:.3f}",
        "-" if result.mlflow_run_id is None else mlflow_run_link(result.mlflow_run_id),
    )
    return result.to_json()


@task(
    name="run-cell",
    task_run_name="{cell.label}",
    retries=CELL_RETRIES,
    retry_delay_seconds=[2, 10],
    cache_policy=NO_CACHE,  # the registry is the cache: a cell resumes or reuses its run
)
async def run_cell(
    cell: Cell, output_dir: str, mlflow_parent_run_id: str | None = None
) -> dict[str, Any]:
    """Evaluate one cell (creating, resuming or reusing its registry run)."""
    return await _evaluate_cell(cell, output_dir, mlflow_parent_run_id)


@flow(
    name="eval-sweep-cell",
    retries=CELL_RETRIES,
    retry_delay_seconds=5,
    validate_parameters=True,
    persist_result=False,  # the registry run is the result, on every machine
)
async def eval_sweep_cell(
    cell: Cell, output_dir: str, mlflow_parent_run_id: str | None = None
) -> dict[str, Any]:
    """One cell of a distributed eval sweep, as its own flow run on any worker of the pool.

    Submitted by ``eval-sweep`` when the sweep's ``distribute`` is on. A run whose
    worker was lost is crashed and rescheduled by the automations ``vfops deploy``
    creates; it resumes the cell's registry run (only missing rollouts are generated).

    Args:
        cell: The cell: one environment ref x one endpoint x one sampling config.
        output_dir: Root folder for run directories on the worker.
        mlflow_parent_run_id: The sweep's MLflow run of this environment, if tracked.
    """
    from prefect.runtime import flow_run

    attempt = flow_run.get_run_count()
    if attempt > MAX_CELL_RUNS:
        # a crash that repeats (e.g. out of memory) would otherwise be rescheduled forever
        raise VfopsError(
            f"cell {cell.label} was started {attempt} times (the limit is {MAX_CELL_RUNS}: "
            "retries and reschedules after a lost worker); see the earlier attempts' logs, "
            "fix the cause and re-run the sweep (completed rollouts are kept)"
        )
    if attempt > 1:
        get_run_logger().info("%s: attempt %d on worker %s", cell.label, attempt, worker_name())
    return await _evaluate_cell(cell, output_dir, mlflow_parent_run_id)


def _start_tracking(cells: list[Cell]) -> dict[str, str]:
    """One parent MLflow run per environment of the sweep ({} when tracking is off)."""
    from vfops.tracking import prefect_run_tags, start_sweep_runs, tracking_enabled

    if not tracking_enabled():
        return {}
    from prefect.runtime import flow_run

    name = str(flow_run.get_name() or flow_run.get_id() or "eval-sweep")
    tags = prefect_run_tags()  # the flow run's id, and its UI address when known
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
            outcomes[index] = _failed_row(cells[index], state.message or state.name or "failed")

    while queue or running:
        while queue and len(running) < parallel:
            index, cell = queue.pop(0)
            parent = (parents or {}).get(cell.env_name)
            # (an async task's future resolves to its coroutine's result)
            future = cast(PrefectFuture[dict[str, Any]], run_cell.submit(cell, output_dir, parent))
            running[future] = index
        collect(next(as_completed(list(running))))
    return [outcomes[index] for index in range(len(cells))]


def _failed_row(cell: Cell, error: str) -> dict[str, Any]:
    return {
        "cell": cell.label,
        "env_ref": cell.env_ref,
        "model_alias": cell.endpoint,
        "sampling": cell.sampling.name,
        "status": "failed",
        "error": error,
    }


def _cell_parameters(cell: Cell, output_dir: str, parent: str | None) -> dict[str, Any]:
    return {
        "cell": cell.model_dump(mode="json"),
        "output_dir": output_dir,
        "mlflow_parent_run_id": parent,
    }


def _distributed_outcome(cell: Cell, flow_run: FlowRun) -> dict[str, Any]:
    """A finished cell flow run's row, read from the registry (the source of truth on
    every machine; Prefect's result storage is local to the worker that ran it)."""
    state = flow_run.state
    base = {"flow_run_id": str(flow_run.id), "flow_run": flow_run_link(flow_run)}
    if state is None or not state.is_completed():
        name = "no state" if state is None else state.name or state.type.value
        return {**_failed_row(cell, f"{name}: {(state and state.message) or name}"), **base}
    from vfops.registry import get_engine

    engine = get_engine()
    run_id = run_of_flow_run(engine, str(flow_run.id))
    if run_id is None:
        return {
            **_failed_row(cell, f"flow run {flow_run.id} completed but no registry run has it"),
            **base,
        }
    since = flow_run.start_time
    result = cell_result_from_registry(cell, run_id, engine=engine, since=since)
    return {**result.to_json(), **base}


def _run_cells_distributed(
    cells: list[Cell], output_dir: str, parallel: int, parents: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """One ``eval-sweep-cell`` flow run per cell, at most ``parallel`` at a time, taken by
    any worker of the pool (:func:`vfops.orchestration.fan_out`: a crashed cell run gets
    :data:`CRASHED_GRACE_S` to be rescheduled); failed cells become error rows."""
    from prefect.runtime import flow_run as this_run

    logger = get_run_logger()
    # a retried sweep submits new cell runs (they resume or reuse the registry runs);
    # within one attempt the key makes a repeated submission return the same run
    plan = FanOut(
        CELL_DEPLOYMENT,
        key=f"{this_run.get_id()}:{this_run.get_run_count()}",
        parallel=parallel,
        crashed_grace_s=CRASHED_GRACE_S,
        poll_s=POLL_S,
    )
    runs = [
        (cell.label, _cell_parameters(cell, output_dir, (parents or {}).get(cell.env_name)))
        for cell in cells
    ]

    def submitted(index: int, run: FlowRun) -> None:
        logger.info("%s: flow run %s", cells[index].label, flow_run_link(run))

    outcomes = {
        index: _distributed_outcome(cells[index], run)
        for index, run in fan_out(plan, runs, submitted=submitted)
    }
    return [outcomes[index] for index in range(len(cells))]


def _report_markdown(results: list[dict[str, Any]]) -> str:
    try:
        from vfops.reports import sweep_chart, sweep_markdown
    except ImportError:  # the reports module is optional here
        return sweep_markdown_fallback(results)
    completed = [r for r in results if "run_id" in r]
    return sweep_markdown(results, sweep_chart(completed) if completed else None)


@flow(name="eval-sweep", validate_parameters=True)
def eval_sweep(spec: SweepSpec) -> list[dict[str, Any]]:
    """Evaluate every environment x endpoint x sampling config; one task per cell, or
    (``distribute``) one ``eval-sweep-cell`` flow run per cell on any worker of the pool.

    Args:
        spec: The sweep: environment refs (NAME, NAME@latest or NAME@VERSION), endpoint
            aliases, sampling configs, N examples and R rollouts per example.
    """
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger] = get_run_logger()
    cells = validate_sweep(spec)  # raises a one-line VfopsError before any model call
    logger.info("sweep of %d cells%s", len(cells), " (distributed)" if spec.distribute else "")
    if not spec.distribute:  # distributed: each cell's worker prepares its own code
        for cell in {c.env_ref: c for c in cells}.values():  # one install per ref, in order
            prepare_environment_task(cell)
    parents = _start_tracking(cells)
    results: list[dict[str, Any]] = []
    run_cells = _run_cells_distributed if spec.distribute else _run_cells
    try:
        results = run_cells(cells, str(output_root(spec)), spec.max_parallel_cells, parents)
    finally:
        if parents:
            from vfops.tracking import finish_sweep_runs

            any_failed = not results or any(r.get("status") == "failed" for r in results)
            with contextlib.suppress(Exception):
                finish_sweep_runs(parents, failed=any_failed)

    create_table_artifact(
        table=sweep_table(results),
        key=TABLE_KEY,
        description="One row per cell: reward ± stderr, rollouts, errors (more in the report).",
    )
    # the chart is inside the report: an image artifact's data: URL shows as text in the UI
    create_markdown_artifact(
        markdown=_report_markdown(results),
        key=REPORT_KEY,
        description="Eval sweep report: chart, table, run ids"
        + (", each cell's flow run." if spec.distribute else "."),
    )

    failed = [r for r in results if r.get("status") == "failed"]
    if failed:
        first = failed[0]
        raise RuntimeError(
            f"{len(failed)} of {len(results)} cells failed; first: {first['cell']}: "
            f"{first['error']}; re-run the flow to finish them (completed rollouts are kept)"
        )
    return results
