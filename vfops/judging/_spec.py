"""The ``judge-score`` job: its parameters (the Prefect UI form), checks and artifacts.

Nothing here imports Prefect; the flow in ``vfops/flows/judge_score.py`` wires these
to Prefect's limits and artifacts.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from vfops._errors import VfopsError
from vfops.budget import Budget, budget_for, limit_name
from vfops.clients import Endpoint, OpenAIClient, RequestLimiter, read_api_key, resolve_endpoint
from vfops.costs import format_cost
from vfops.judging._rescore import RescoreResult, rescore_run, resolve_run_id
from vfops.rubrics import DEFAULT_JUDGE_PROMPT, JudgeRubric

if TYPE_CHECKING:
    from sqlalchemy import Engine

ENDPOINTS_ENV_VAR = "VFOPS_ENDPOINTS"
DEFAULT_ENDPOINTS_FILE = "endpoints.toml"


class JudgeScoreSpec(BaseModel):
    """Re-score a registry run's rollouts with a judge model (the ``judge-score`` form)."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(
        min_length=1, description="The eval run to re-score: its id or a unique prefix."
    )
    judge: str = Field(
        min_length=1,
        description="Endpoint alias of the judge (from the endpoints file); its key comes from "
        "the environment variable the alias names, never from here.",
    )
    judge_model: str | None = Field(
        default=None,
        description="Model name sent to the judge endpoint; default: the alias's model.",
    )
    endpoints_file: str | None = Field(
        default=None,
        description="The endpoints file; default: $VFOPS_ENDPOINTS, else ./endpoints.toml.",
    )
    budgets_file: str | None = Field(
        default=None,
        description="The budgets file ([budget.<alias>] tables); default: $VFOPS_BUDGETS, "
        "else ./budgets.toml when it exists.",
    )
    requests_per_s: float | None = Field(
        default=None,
        gt=0,
        description="Judge requests per second across every worker (the Prefect rate limit "
        "named after the judge model); default: the budget's, else none.",
    )
    max_concurrent: int = Field(
        default=8, ge=1, le=4096, description="Judge requests in flight at once."
    )
    global_max_concurrent: int | None = Field(
        default=None,
        ge=1,
        description="Judge requests in flight across every worker (a Prefect concurrency "
        "limit); default: the budget's, else none.",
    )
    judge_prompt: str | None = Field(
        default=None,
        description="Judge prompt template with {question}, {answer} and {response}; "
        "default: the built-in yes/no template.",
    )
    judge_sampling_args: dict[str, Any] = Field(
        default_factory=dict,
        description='Sampling arguments of the judge, e.g. {"temperature": 0}.',
    )
    max_retries: int = Field(
        default=3,
        ge=0,
        le=20,
        description="Retries of a failed judge request (429, 5xx, timeouts).",
    )
    request_timeout_s: float = Field(default=120.0, gt=0, description="Timeout of one request.")


@dataclass(frozen=True, slots=True)
class JudgeScorePlan:
    """A checked :class:`JudgeScoreSpec`: everything resolved, nothing called yet."""

    spec: JudgeScoreSpec
    run_id: str
    endpoint: Endpoint
    judge_model: str
    limit_name: str
    budget: Budget
    template: str


def endpoints_path(endpoints_file: str | None) -> Path:
    """The endpoints file: explicit, ``$VFOPS_ENDPOINTS``, or ./endpoints.toml."""
    chosen = endpoints_file or os.environ.get(ENDPOINTS_ENV_VAR) or DEFAULT_ENDPOINTS_FILE
    return Path(chosen).expanduser().resolve()


def plan_judge_score(spec: JudgeScoreSpec, engine: Engine) -> JudgeScorePlan:
    """Check ``spec`` against the registry, the endpoints and budgets files and the
    environment, before any model call; one-line :class:`VfopsError` on a problem
    (unknown run, unknown alias, unset key variable, bad template or budget)."""
    run_id = resolve_run_id(engine, spec.run_id)
    endpoint = resolve_endpoint(
        spec.judge.strip(), endpoints_file=endpoints_path(spec.endpoints_file)
    )
    read_api_key(endpoint, required=True)  # fail now, not at the first judge request
    judge_model = (spec.judge_model or "").strip() or endpoint.model
    template = spec.judge_prompt or DEFAULT_JUDGE_PROMPT
    try:
        template.format(question="", answer="", response="")
    except (KeyError, IndexError, ValueError) as exc:
        raise VfopsError(
            f"judge_prompt is not a valid template ({type(exc).__name__}: {exc}); it may use "
            "{question}, {answer} and {response}, and must write other braces as {{ }}"
        ) from None
    budget = budget_for(
        endpoint.alias,
        budgets_file=spec.budgets_file,
        max_concurrent=spec.global_max_concurrent,
        requests_per_s=spec.requests_per_s,
    )
    return JudgeScorePlan(
        spec=spec,
        run_id=run_id,
        endpoint=endpoint,
        judge_model=judge_model,
        limit_name=limit_name("judge", judge_model),
        budget=budget,
        template=template,
    )


def make_judge_rubric(
    plan: JudgeScorePlan, *, limiter: RequestLimiter | None = None
) -> JudgeRubric:
    """The plan's judge: an :class:`OpenAIClient` (retries its own requests, each
    attempt through ``limiter``) inside a :class:`JudgeRubric` that does not retry
    on top."""
    spec = plan.spec
    client = OpenAIClient(
        plan.endpoint.base_url,
        api_key=read_api_key(plan.endpoint, required=True),
        timeout_s=spec.request_timeout_s,
        max_retries=spec.max_retries,
        max_connections=max(64, spec.max_concurrent),
        limiter=limiter,
        pricing=plan.endpoint.pricing,
    )
    return JudgeRubric(
        judge_client=client,
        judge_model=plan.judge_model,
        judge_prompt=plan.template,
        judge_sampling_args=spec.judge_sampling_args,
        max_concurrent=spec.max_concurrent,
        max_retries=0,
    )


async def run_judge_score(
    plan: JudgeScorePlan, engine: Engine, *, limiter: RequestLimiter | None = None
) -> RescoreResult:
    """Re-score the plan's run (:func:`rescore_run`) and close the judge client."""
    rubric = make_judge_rubric(plan, limiter=limiter)
    try:
        return await rescore_run(
            engine,
            plan.run_id,
            rubric,
            max_concurrent=plan.spec.max_concurrent,
            keep_judgements=False,
        )
    finally:
        await rubric.aclose()


_KEY_UNSAFE = re.compile(r"[^a-z0-9-]+")


def artifact_key(run_id: str) -> str:
    """The Prefect artifact key of a run's judge scores (lowercase, digits, dashes)."""
    return "judge-score-" + (_KEY_UNSAFE.sub("-", run_id.lower()).strip("-")[:40] or "run")


def _fmt(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def judge_score_table(result: RescoreResult, plan: JudgeScorePlan) -> list[dict[str, Any]]:
    """One row per judged run, for a Prefect table artifact."""
    rate = plan.budget.requests_per_s
    return [
        {
            "run_id": result.run_id,
            "judge_model": result.judge_model,
            "mean_score": result.mean_score,
            "rollouts": result.n_rollouts,
            "scored": result.n_scored,
            "judged": result.n_judged,
            "cached": result.n_cached,
            "skipped": result.n_skipped,
            "errors": result.n_errors,
            "cost": format_cost(result.cost_usd),
            "requests_per_s_limit": rate,
            "elapsed_s": round(result.elapsed_s, 2),
        }
    ]


def judge_score_markdown(result: RescoreResult, plan: JudgeScorePlan) -> str:
    """A markdown summary of a judge-score run (no secrets: aliases and models only)."""
    budget = plan.budget
    lines = [
        f"# Judge scores of run `{result.run_id}`",
        "",
        f"- judge: alias `{plan.endpoint.alias}`, model `{result.judge_model}`",
        f"- budget `{plan.limit_name}`: "
        f"{budget.requests_per_s if budget.requests_per_s is not None else 'no'} requests/s, "
        f"{budget.max_concurrent if budget.max_concurrent is not None else 'no'} global "
        f"concurrency limit; {plan.spec.max_concurrent} in flight in this flow",
        "",
        "| mean score | rollouts | scored | new judge requests | from cache | skipped | errors |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {_fmt(result.mean_score)} | {result.n_rollouts} | {result.n_scored} | "
        f"{result.n_judged} | {result.n_cached} | {result.n_skipped} | {result.n_errors} |",
        "",
        f"New judge requests cost {format_cost(result.cost_usd)}, added to the rollouts "
        "they scored. "
        f"Took {result.elapsed_s:.1f} s. Verdicts are stored in the registry's judge cache: "
        "rerunning with the same judge, template and sampling arguments makes no new requests.",
    ]
    if result.errors:
        lines += ["", "## Errors (first ones)", ""]
        lines += [f"- {message.replace('|', '/')}" for message in result.errors]
    return "\n".join(lines) + "\n"
