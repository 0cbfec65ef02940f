"""``judge-score``: re-score a registry run's rollouts with a judge, under a shared budget.

A thin layer over :mod:`vfops.judging` and :mod:`vfops.orchestration`: the flow checks
its parameters before any model call (unknown run, unknown endpoint alias, unset
key variable, bad template: one clear line on the failed flow run), makes sure
the Prefect global limits named after the judge model exist (``vfops-judge-<model>``
for concurrency, ``...-rate`` for requests per second), so the budget holds across
every worker and flow, re-scores through the registry's judge cache (a rerun makes
no judge request) and attaches a table and a markdown artifact.
"""

from __future__ import annotations

from typing import Any, cast

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from vfops._errors import VfopsError
from vfops.judging import (
    JudgeScorePlan,
    JudgeScoreSpec,
    RescoreResult,
    artifact_key,
    judge_score_markdown,
    judge_score_table,
    plan_judge_score,
    run_judge_score,
)
from vfops.orchestration import prefect_limiter
from vfops.registry import get_engine


@task(name="rescore-run", retries=1, retry_delay_seconds=5, cache_policy=NO_CACHE)
async def rescore_task(plan: JudgeScorePlan) -> RescoreResult:
    """Judge the run's rollouts, every request through the judge model's budget.

    A retry is cheap: verdicts already stored come from the registry's judge cache.
    """
    budget = plan.budget
    limiter = await prefect_limiter(
        plan.limit_name,
        max_concurrent=budget.max_concurrent,
        requests_per_s=budget.requests_per_s,
        concurrency_slots=plan.spec.max_concurrent,
    )
    get_run_logger().info(
        "judge %s (alias %s): budget %s: %s",
        plan.judge_model,
        plan.endpoint.alias,
        plan.limit_name,
        "none on the server" if limiter is None else limiter,
    )
    try:
        return await run_judge_score(plan, get_engine(), limiter=limiter)
    finally:
        if limiter is not None:
            await limiter.aclose()


@flow(name="judge-score", validate_parameters=True)
def judge_score(spec: JudgeScoreSpec) -> dict[str, Any]:
    """Re-score an eval run's rollouts with a judge model.

    Args:
        spec: The run id, the judge's endpoint alias, and the judge's budget
            (requests per second, requests in flight).
    """
    logger = get_run_logger()
    plan = plan_judge_score(spec, get_engine())  # raises before any model call
    # submitted: the async task runs on the task runner's own event loop
    result = cast(RescoreResult, rescore_task.submit(plan).result())
    summary = result.summary()
    logger.info(
        "run %s: mean judge score %s over %d rollouts (%d new judge requests, %d from cache, "
        "%d skipped, %d errors)",
        result.run_id,
        "n/a" if result.mean_score is None else f"{result.mean_score:.4f}",
        result.n_rollouts,
        result.n_judged,
        result.n_cached,
        result.n_skipped,
        result.n_errors,
    )
    key = artifact_key(result.run_id)
    create_table_artifact(
        table=judge_score_table(result, plan),
        key=key,
        description=f"Judge scores of run {result.run_id} by {result.judge_model}",
    )
    create_markdown_artifact(
        markdown=judge_score_markdown(result, plan),
        key=key + "-report",
        description=f"Judge scores of run {result.run_id} by {result.judge_model}",
    )
    if result.n_errors and not result.n_scored:
        raise VfopsError(
            f"every judge request failed ({result.n_errors}); first: {result.errors[0]}"
        )
    return summary
