"""The promotion gate's evidence: one gate environment's runs and their comparison.

Split from :mod:`vfops.models._promotion` so that the decision (who holds the alias,
what is recorded) reads apart from how the evidence is gathered: which request a gate
evaluation answers, when an existing run answers it instead (no version is evaluated
twice), and the paired comparison of the candidate with the holder
(:func:`vfops.stats.compare_runs_statistically`, the nightly sweep's test).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfops._errors import VfopsError
from vfops.checkpoints import ModelVersionInfo

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

PROMOTION_TAG = "promotion"


@dataclass(frozen=True)
class EnvGateResult:
    """One gate environment: the two runs and the paired comparison."""

    env: str
    candidate_run_id: str
    candidate_mean: float
    holder_run_id: str | None = None
    holder_mean: float | None = None
    delta: float | None = None
    verdict: str | None = None
    regressed: bool = False
    summary: str = ""
    candidate_reused: bool = False
    holder_reused: bool = False
    candidate_errors: int = 0
    holder_errors: int = 0
    ci_low: float | None = None
    ci_high: float | None = None
    """The paired bootstrap's confidence interval of ``delta`` (None: no holder)."""

    @property
    def inconclusive(self) -> bool:
        """A gate run has errored rollouts: they would count as 0.0, so the comparison
        would measure the errors (a crashed judge, a flaky tool), not the models."""
        return bool(self.candidate_errors or self.holder_errors)

    def describe(self, metric: str) -> str:
        if self.holder_run_id is None:
            return f"{self.env}: {metric} {self.candidate_mean:.3f} (no holder to compare with)"
        return f"{self.env}: {self.summary}"


@dataclass(frozen=True)
class GateRequest:
    """What one gate evaluation runs: the same for the candidate and the holder."""

    env: str
    num_examples: int
    rollouts_per_example: int
    sampling_args: dict[str, Any]
    env_args: dict[str, Any]


@dataclass(frozen=True)
class GateRun:
    run_id: str
    reused: bool


@dataclass(frozen=True)
class GateSettings:
    """How every gate evaluation and comparison of one promotion runs."""

    metric: str
    alpha: float
    seed: int
    engine: Engine
    output_root: Path
    reuse: bool


def metric_values(engine: Engine, run_id: str, metric: str) -> dict[int, list[float]]:
    """``example_id -> values`` of ``metric`` (``reward``/``reward_mean`` or a rubric metric).

    Errored rollouts count as 0.0, as in :func:`vfops.evaluation._compare.per_example_rewards`.
    """
    from vfops.registry import iter_rollout_scores, session_scope

    key = metric.removesuffix("_mean")
    values: dict[int, list[float]] = {}
    seen: set[str] = set()
    with session_scope(engine, write=False) as session:
        for record in iter_rollout_scores(session, run_id):
            if key == "reward":
                value = record.reward
            else:
                seen.update(record.metrics)
                raw = record.metrics.get(key)
                if raw is None and not record.errored:
                    raise VfopsError(
                        f"metric {metric!r} is not in the rollouts of run {run_id} "
                        f"(have: reward, {', '.join(sorted(seen)) or 'no rubric metrics'}); "
                        "pass --metric reward_mean or one of those"
                    )
                value = None if raw is None else float(raw)
            values.setdefault(record.example_id, []).append(float(value or 0.0))
    return values


def errored_rollouts(engine: Engine, run_id: str) -> int:
    """How many of a run's rollouts ended with an error (its recorded summary)."""
    run = _run_row(engine, run_id)
    summary = (run.summary if run is not None else None) or {}
    return int(summary.get("errors") or 0)


def _run_row(engine: Engine, run_id: str) -> Any:
    from vfops.registry import get_run, session_scope

    with session_scope(engine, write=False) as session:
        run = get_run(session, run_id)
        if run is not None:
            session.expunge(run)
        return run


def runs_cost(engine: Engine, run_ids: set[str]) -> float | None:
    """The sum of the runs' rollout costs; ``None`` when none of them is priced."""
    from vfops.registry import run_cost, session_scope

    with session_scope(engine, write=False) as session:
        costs = [
            cost for run_id in sorted(run_ids) if (cost := run_cost(session, run_id)) is not None
        ]
    return sum(costs) if costs else None


def evidence_request(engine: Engine, env: str, run_id: str, candidate_uri: str) -> GateRequest:
    """The gate request an existing run of the candidate answers; refuses a run that can't."""
    run = _run_row(engine, run_id)
    if run is None:
        raise VfopsError(f"evidence run {run_id} is not in the registry; check `vfops runs list`")
    problem = None
    if run.environment_name != env:
        problem = f"is a run of {run.environment_name}, not of {env}"
    elif run.model != candidate_uri:
        problem = (
            f"evaluated {run.model}, not {candidate_uri}; evaluate the candidate with "
            f"vfops eval {env} -m {candidate_uri}"
        )
    elif run.status != "completed":
        problem = f"is {run.status}; finish it with vfops eval --resume, or drop --run"
    if problem is not None:
        raise VfopsError(f"evidence run {run_id} {problem}")
    return GateRequest(
        env=env,
        num_examples=run.num_examples,
        rollouts_per_example=run.rollouts_per_example,
        sampling_args=dict(run.sampling_args),
        env_args=dict(run.env_args),
    )


def find_reusable_run(engine: Engine, request: GateRequest, model_uri: str) -> str | None:
    """The newest completed run of ``model_uri`` answering ``request`` with today's env code.

    Any completed run counts (an earlier promotion, a nightly sweep, a plain
    ``vfops eval -m models:/NAME/VERSION``) as long as the environment code, N, R,
    sampling and environment arguments are the ones this gate would use.
    """
    from vfops.evaluation import resolve_provenance
    from vfops.registry import RunFilter, list_runs, session_scope

    code_hash = resolve_provenance(engine, request.env).code_hash
    with session_scope(engine, write=False) as session:
        runs = list_runs(
            session,
            RunFilter(
                env_name=request.env,
                model=model_uri,
                status="completed",
                num_examples=request.num_examples,
                rollouts_per_example=request.rollouts_per_example,
                environment_content_hash=code_hash,
                limit=None,
            ),
        )
        for run in runs:
            if (run.summary or {}).get("errors"):
                continue  # not evidence (see EnvGateResult.inconclusive): evaluate afresh
            if run.sampling_args == request.sampling_args and run.env_args == request.env_args:
                return str(run.id)
    return None


async def evaluate_gate(
    request: GateRequest, version: ModelVersionInfo, settings: GateSettings
) -> GateRun:
    """A completed run of ``version`` for ``request``: reused when allowed, else evaluated
    through :func:`vfops.evaluation.evaluate_async` (registry and MLflow, like any run)."""
    from vfops.evaluation import EvalRequest, ModelOptions, RunOptions, evaluate_async

    engine = settings.engine
    if settings.reuse:
        existing = await asyncio.to_thread(find_reusable_run, engine, request, version.uri)
        if existing is not None:
            return GateRun(existing, reused=True)
    eval_request = EvalRequest(
        env_name=request.env,
        model=version.uri,
        num_examples=request.num_examples,
        rollouts_per_example=request.rollouts_per_example,
        sampling_args=dict(request.sampling_args),
        env_args=dict(request.env_args),
        tags=[PROMOTION_TAG],
    )
    result = await evaluate_async(
        eval_request,
        RunOptions(output_root=settings.output_root, engine=engine),
        model_options=ModelOptions(seed=settings.seed),
    )
    if result.status != "completed":
        raise VfopsError(
            f"gate eval of {version.uri} on {request.env} ended {result.status} "
            f"(run {result.run_id}): {result.error or 'see the run'}; fix it and promote again"
        )
    assert result.run_id is not None
    return GateRun(result.run_id, reused=False)


async def gate_one_env(
    request: GateRequest,
    candidate: GateRun,
    holder: ModelVersionInfo | None,
    settings: GateSettings,
) -> EnvGateResult:
    """Compare the candidate's run with the holder's on one gate environment (the
    holder answers exactly the candidate's request: N, R, sampling, env args)."""
    from vfops.stats import compare_runs_statistically

    engine, metric = settings.engine, settings.metric
    cand_values = metric_values(engine, candidate.run_id, metric)
    cand_errors = errored_rollouts(engine, candidate.run_id)
    if holder is None:
        return EnvGateResult(
            request.env,
            candidate.run_id,
            _mean(cand_values),
            candidate_reused=candidate.reused,
            candidate_errors=cand_errors,
        )
    held = await evaluate_gate(request, holder, settings)
    holder_values = metric_values(engine, held.run_id, metric)
    report = compare_runs_statistically(
        holder_values, cand_values, alpha=settings.alpha, seed=settings.seed
    )
    return EnvGateResult(
        env=request.env,
        candidate_run_id=candidate.run_id,
        candidate_mean=report.mean_b,
        holder_run_id=held.run_id,
        holder_mean=report.mean_a,
        delta=report.delta,
        verdict=report.verdict,
        regressed=report.regressed,
        summary=report.summary,
        candidate_reused=candidate.reused,
        holder_reused=held.reused,
        candidate_errors=cand_errors,
        holder_errors=errored_rollouts(engine, held.run_id),
        ci_low=report.ci_low,
        ci_high=report.ci_high,
    )


def inconclusive_detail(result: EnvGateResult, candidate: str, holder: str | None) -> str:
    runs = [
        f"run {run_id} of v{version} has {errors} errored rollout{'s' if errors != 1 else ''}"
        for run_id, version, errors in (
            (result.candidate_run_id, candidate, result.candidate_errors),
            (result.holder_run_id, holder, result.holder_errors),
        )
        if errors
    ]
    return f"{result.env} inconclusive: {' and '.join(runs)} (they would count as 0)"


def _mean(values: Mapping[int, Sequence[float]]) -> float:
    flat = [v for vs in values.values() for v in vs]
    return sum(flat) / len(flat) if flat else 0.0
