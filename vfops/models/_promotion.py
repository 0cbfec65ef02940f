"""Evidence-gated promotion of a model version to an alias (``champion``).

The candidate and the current alias holder are evaluated in-process
(:class:`vfops.local.LocalModelClient`) on every gate environment with the same
request (examples, rollouts, sampling arguments, seed); both runs are recorded
in the vfops registry, so the evidence has run ids. Existing completed runs are
used instead when they answer exactly that request (given explicitly as evidence
for the candidate, or found in the registry), so no version is evaluated twice. Per environment, the
candidate is compared with the holder by :func:`vfops.stats.compare_runs_statistically`
(the nightly sweep's paired test) on the configured metric.

The alias moves only when no gate environment regresses significantly, i.e. the
metric improves or holds everywhere. ``force`` moves it anyway; the decision is
then recorded as forced. Every decision, promoted or refused, is appended to the
``alias_events`` table: this module only ever inserts into it.
"""

from __future__ import annotations

import asyncio
import getpass
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

from vfops._errors import VfopsError
from vfops._settings import vfops_home
from vfops._twins import blocking_twin
from vfops.checkpoints import ModelVersionInfo, resolve_version
from vfops.tracking import mlflow_client

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from vfops.stats import RegressionReport

Outcome = Literal["promoted", "refused"]
_P = ParamSpec("_P")
_T = TypeVar("_T")

PROMOTION_TAG = "promotion"


class PromotionRefusedError(VfopsError):
    """The gate refused the candidate; ``decision`` holds the evidence."""

    exit_code = 1

    def __init__(self, decision: PromotionDecision) -> None:
        super().__init__(decision.reason)
        self.decision = decision


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
class PromotionDecision:
    name: str
    alias: str
    from_version: str | None
    to_version: str
    outcome: Outcome
    forced: bool
    metric: str
    actor: str
    reason: str
    envs: list[EnvGateResult] = field(default_factory=list)
    event_id: int | None = None

    @property
    def promoted(self) -> bool:
        return self.outcome == "promoted"

    def raise_if_refused(self) -> None:
        if not self.promoted:
            raise PromotionRefusedError(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AliasEventInfo:
    """One row of ``alias_events``."""

    id: int
    created_at: str
    actor: str
    model_name: str
    alias: str
    from_version: str | None
    to_version: str
    outcome: str
    forced: bool
    metric: str
    evidence: dict[str, Any]
    reason: str


def default_actor() -> str:
    user = os.environ.get("USER") or os.environ.get("USERNAME")
    if user:
        return user
    try:
        return getpass.getuser()
    except Exception:  # pragma: no cover - no user database
        return "unknown"


def metric_values(engine: Engine, run_id: str, metric: str) -> dict[int, list[float]]:
    """``example_id -> values`` of ``metric`` (``reward``/``reward_mean`` or a rubric metric).

    Errored rollouts count as 0.0, as in :func:`vfops.evaluation._compare.per_example_rewards`.
    """
    from vfops.registry import iter_rollouts

    key = metric.removesuffix("_mean")
    values: dict[int, list[float]] = {}
    seen: set[str] = set()
    for record in iter_rollouts(engine, run_id):
        if key == "reward":
            value = record.reward
        else:
            seen.update(record.metrics)
            raw = record.metrics.get(key)
            if raw is None and record.error is None:
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


def _run_row(engine: Engine, run_id: str) -> Any:
    from vfops.registry import get_run, session_scope

    with session_scope(engine, write=False) as session:
        run = get_run(session, run_id)
        if run is not None:
            session.expunge(run)
        return run


def _runs_cost(engine: Engine, run_ids: set[str]) -> float | None:
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
    from vfops.registry import list_runs, session_scope

    code_hash = resolve_provenance(engine, request.env).code_hash
    with session_scope(engine, write=False) as session:
        runs = list_runs(
            session,
            env_name=request.env,
            model=model_uri,
            status="completed",
            num_examples=request.num_examples,
            rollouts_per_example=request.rollouts_per_example,
            environment_content_hash=code_hash,
            limit=None,
        )
        for run in runs:
            if (run.summary or {}).get("errors"):
                continue  # not evidence (see EnvGateResult.inconclusive): evaluate afresh
            if run.sampling_args == request.sampling_args and run.env_args == request.env_args:
                return str(run.id)
    return None


async def _evaluate(
    request: GateRequest,
    version: ModelVersionInfo,
    *,
    seed: int,
    engine: Engine,
    output_root: Path,
    reuse: bool,
) -> GateRun:
    """A completed run of ``version`` for ``request``: reused when allowed, else evaluated
    through :func:`vfops.evaluation.evaluate_async` (registry and MLflow, like any run)."""
    from vfops.evaluation import EvalRequest, ModelOptions, evaluate_async

    if reuse:
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
        model_options=ModelOptions(seed=seed),
        output_root=output_root,
        engine=engine,
    )
    if result.status != "completed":
        raise VfopsError(
            f"gate eval of {version.uri} on {request.env} ended {result.status} "
            f"(run {result.run_id}): {result.error or 'see the run'}; fix it and promote again"
        )
    assert result.run_id is not None
    return GateRun(result.run_id, reused=False)


def _inconclusive_detail(result: EnvGateResult, candidate: str, holder: str | None) -> str:
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


async def promote_async(
    name: str,
    version: str | int,
    *,
    alias: str = "champion",
    gate_envs: Sequence[str],
    num_examples: int = 20,
    rollouts_per_example: int = 1,
    metric: str = "reward_mean",
    force: bool = False,
    actor: str | None = None,
    sampling_args: Mapping[str, Any] | None = None,
    env_args: Mapping[str, Mapping[str, Any]] | None = None,
    alpha: float = 0.05,
    seed: int = 0,
    engine: Engine | None = None,
    output_root: Path | None = None,
    evidence_runs: Mapping[str, str] | None = None,
    reuse: bool = True,
) -> PromotionDecision:
    """Evaluate, compare, decide, record; see the module docstring.

    Returns the decision (``outcome`` ``"promoted"`` or ``"refused"``; call
    :meth:`PromotionDecision.raise_if_refused` to turn a refusal into an error).
    ``env_args`` maps a gate environment to its ``load_environment`` arguments.

    ``evidence_runs`` maps a gate environment to an existing completed registry run
    of the candidate (its model must be ``models:/NAME/VERSION``); the holder is
    then evaluated with that run's N, R, sampling and environment arguments. With
    ``reuse`` (the default) any completed run of a model that answers exactly the
    gate's request with today's environment code is used instead of evaluating
    again (:func:`find_reusable_run`).
    """
    from vfops.evaluation import EvalRequest

    # the gate's request, checked before MLflow or the registry is touched
    EvalRequest(
        env_name=name,
        model=name,
        num_examples=num_examples,
        rollouts_per_example=rollouts_per_example,
        sampling_args=dict(sampling_args or {}),
    ).validate()

    from mlflow.exceptions import MlflowException

    from vfops.registry import get_engine, record_alias_event, session_scope
    from vfops.stats import compare_runs_statistically

    version = str(version)
    actor = actor or default_actor()
    engine = engine or get_engine()
    output_root = output_root or vfops_home() / "promotions"
    client = mlflow_client()
    candidate: ModelVersionInfo = resolve_version(f"models:/{name}/{version}", client)
    try:
        holder: ModelVersionInfo | None = ModelVersionInfo.from_mlflow(
            client.get_model_version_by_alias(name, alias)
        )
    except MlflowException:
        holder = None
    if holder is not None and holder.version == candidate.version:
        raise VfopsError(f"{name} version {version} already holds @{alias}; nothing to promote")
    envs = list(dict.fromkeys(gate_envs))
    if not envs and not force:
        raise VfopsError(
            "no gate environment: pass --env ENV (repeatable), or --force to promote "
            "without evidence (recorded as forced)"
        )

    unknown = sorted(set(evidence_runs or {}) - set(envs))
    if unknown:
        raise VfopsError(
            f"evidence run given for {unknown[0]!r}, which is not a gate environment "
            f"({', '.join(envs) or 'none'}); add --env {unknown[0]} or drop its --run"
        )
    given = dict(evidence_runs or {})
    requests = [
        evidence_request(engine, env, given[env], candidate.uri)
        if env in given
        else GateRequest(
            env=env,
            num_examples=num_examples,
            rollouts_per_example=rollouts_per_example,
            sampling_args=dict(sampling_args or {}),
            env_args=dict((env_args or {}).get(env, {})),
        )
        for env in envs
    ]  # every check before any model is loaded
    common: dict[str, Any] = {
        "seed": seed,
        "engine": engine,
        "output_root": output_root,
        "reuse": reuse,
    }
    results: list[EnvGateResult] = []
    for request in requests:
        if request.env in given:
            cand = GateRun(given[request.env], reused=True)
        else:
            cand = await _evaluate(request, candidate, **common)
        cand_values = metric_values(engine, cand.run_id, metric)
        if holder is None:
            results.append(
                EnvGateResult(
                    request.env, cand.run_id, _mean(cand_values), candidate_reused=cand.reused,
                    candidate_errors=errored_rollouts(engine, cand.run_id),
                )
            )  # fmt: skip
            continue
        # the holder answers exactly the candidate's request (N, R, sampling, env args)
        held = await _evaluate(request, holder, **common)
        holder_values = metric_values(engine, held.run_id, metric)
        report: RegressionReport = compare_runs_statistically(
            holder_values, cand_values, alpha=alpha, seed=seed
        )
        results.append(
            EnvGateResult(
                env=request.env,
                candidate_run_id=cand.run_id,
                candidate_mean=report.mean_b,
                holder_run_id=held.run_id,
                holder_mean=report.mean_a,
                delta=report.delta,
                verdict=report.verdict,
                regressed=report.regressed,
                summary=report.summary,
                candidate_reused=cand.reused,
                holder_reused=held.reused,
                candidate_errors=errored_rollouts(engine, cand.run_id),
                holder_errors=errored_rollouts(engine, held.run_id),
            )
        )

    failed = [r for r in results if r.regressed]
    inconclusive = [r for r in results if r.inconclusive]
    from_version = holder.version if holder else None
    subject = f"{name} v{version} -> @{alias}"
    if failed or inconclusive:
        detail = "; ".join(
            [
                f"{r.env} regressed: {metric} {r.holder_mean:.3f} -> {r.candidate_mean:.3f} "
                f"(delta {r.delta:+.3f}, {r.verdict})"
                for r in failed
            ]
            + [_inconclusive_detail(r, candidate.version, from_version) for r in inconclusive]
        )
        if force:
            outcome: Outcome = "promoted"
            reason = f"{subject} FORCED over a failed gate (holder v{from_version}): {detail}"
        else:
            outcome = "refused"
            fix = (
                "fix the errors' cause (vfops runs show RUN --failed) and promote again"
                if inconclusive
                else "improve the candidate"
            )
            reason = (
                f"refused {subject} (holder v{from_version}): {detail}; "
                f"{fix}, or pass --force (recorded as forced)"
            )
    else:
        outcome = "promoted"
        if not envs:
            reason = f"{subject} FORCED without gate environments"
        elif holder is None:
            reason = f"{subject}: no previous holder; evaluated on {', '.join(envs)}"
        else:
            deltas = ", ".join(
                f"{r.env} {metric} delta {r.delta:+.3f} ({r.verdict})" for r in results
            )
            reason = f"{subject} (was v{from_version}): gate passed: {deltas}"
            if force:
                reason += " [--force given]"

    evidence = {
        r.env: {
            "candidate_run_id": r.candidate_run_id,
            "holder_run_id": r.holder_run_id,
            "candidate_mean": r.candidate_mean,
            "holder_mean": r.holder_mean,
            "delta": r.delta,
            "verdict": r.verdict,
            "regressed": r.regressed,
            "summary": r.summary,
            "candidate_reused": r.candidate_reused,
            "holder_reused": r.holder_reused,
            "candidate_errors": r.candidate_errors,
            "holder_errors": r.holder_errors,
            "num_examples": q.num_examples,
            "rollouts_per_example": q.rollouts_per_example,
            "sampling_args": q.sampling_args,
            "env_args": q.env_args,
        }
        for r, q in zip(results, requests, strict=True)
    }
    gate_runs = {r.candidate_run_id for r in results} | {
        r.holder_run_id for r in results if r.holder_run_id is not None
    }
    evidence_doc: dict[str, Any] = {
        "envs": evidence,
        # what the gate's runs cost (None: nothing priced, e.g. in-process models)
        "cost_usd": _runs_cost(engine, gate_runs),
        "num_examples": num_examples,
        "rollouts_per_example": rollouts_per_example,
        "sampling_args": dict(sampling_args or {}),
        "alpha": alpha,
        "seed": seed,
        "reuse": reuse,
    }
    # One transaction: the row is committed only if the alias move succeeded.
    with session_scope(engine) as session:
        row = record_alias_event(
            session,
            actor=actor,
            model_name=name,
            alias=alias,
            from_version=from_version,
            to_version=candidate.version,
            outcome=outcome,
            forced=force,
            metric=metric,
            evidence=evidence_doc,
            reason=reason,
        )
        event_id = int(row.id)
        if outcome == "promoted":
            await asyncio.to_thread(
                client.set_registered_model_alias, name, alias, candidate.version
            )
    return PromotionDecision(
        name=name,
        alias=alias,
        from_version=from_version,
        to_version=candidate.version,
        outcome=outcome,
        forced=force,
        metric=metric,
        actor=actor,
        reason=reason,
        envs=results,
        event_id=event_id,
    )


promote = blocking_twin(promote_async)
"""Synchronous :func:`promote_async` (same arguments)."""


def promotion_history(
    name: str, *, alias: str | None = None, engine: Engine | None = None
) -> list[AliasEventInfo]:
    """Every recorded decision on model ``name`` (optionally one alias), oldest first."""
    from vfops.registry import get_engine, list_alias_events, session_scope

    engine = engine or get_engine()
    with session_scope(engine, write=False) as session:
        rows = list_alias_events(session, name, alias=alias)
        return [
            AliasEventInfo(
                id=int(r.id),
                created_at=r.created_at.isoformat(),
                actor=r.actor,
                model_name=r.model_name,
                alias=r.alias,
                from_version=r.from_version,
                to_version=r.to_version,
                outcome=r.outcome,
                forced=r.forced,
                metric=r.metric,
                evidence=dict(r.evidence),
                reason=r.reason,
            )
            for r in rows
        ]
