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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from vfops._errors import VfopsError
from vfops._settings import vfops_home
from vfops._twins import blocking_twin
from vfops.checkpoints import ModelVersionInfo, resolve_version
from vfops.models._gate import (
    EnvGateResult,
    GateRequest,
    GateRun,
    GateSettings,
    evaluate_gate,
    evidence_request,
    gate_one_env,
    inconclusive_detail,
    runs_cost,
)
from vfops.tracking import mlflow_client

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

Outcome = Literal["promoted", "refused"]


@dataclass(frozen=True)
class PromotionRequest:
    """What :func:`promote_async` is asked: a candidate, an alias, and the gate's request.

    ``env_args`` maps a gate environment to its ``load_environment`` arguments.
    ``evidence_runs`` maps a gate environment to an existing completed registry run of
    the candidate (its model must be ``models:/NAME/VERSION``); the holder is then
    evaluated with that run's N, R, sampling and environment arguments. With ``reuse``
    (the default) any completed run of a model that answers exactly the gate's request
    with today's environment code is used instead of evaluating again
    (:func:`vfops.models._gate.find_reusable_run`). ``force`` moves the alias even
    when the gate fails (recorded as forced); ``actor`` defaults to the user.
    """

    name: str
    version: str | int
    gate_envs: Sequence[str]
    alias: str = "champion"
    num_examples: int = 20
    rollouts_per_example: int = 1
    metric: str = "reward_mean"
    force: bool = False
    actor: str | None = None
    sampling_args: Mapping[str, Any] | None = None
    env_args: Mapping[str, Mapping[str, Any]] | None = None
    alpha: float = 0.05
    seed: int = 0
    evidence_runs: Mapping[str, str] | None = None
    reuse: bool = True

    @property
    def subject(self) -> str:
        return f"{self.name} v{self.version} -> @{self.alias}"


class PromotionRefusedError(VfopsError):
    """The gate refused the candidate; ``decision`` holds the evidence."""

    exit_code = 1

    def __init__(self, decision: PromotionDecision) -> None:
        super().__init__(decision.reason)
        self.decision = decision


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


async def promote_async(
    request: PromotionRequest,
    *,
    engine: Engine | None = None,
    output_root: Path | None = None,
) -> PromotionDecision:
    """Evaluate, compare, decide, record; see the module docstring.

    Returns the decision (``outcome`` ``"promoted"`` or ``"refused"``; call
    :meth:`PromotionDecision.raise_if_refused` to turn a refusal into an error).
    ``output_root`` holds the gate evaluations' outputs (default
    ``$VFOPS_HOME/promotions``).
    """
    from vfops.registry import get_engine

    _check_request(request)  # before MLflow or the registry is touched
    request = _normalised(request)
    engine = engine or get_engine()
    client = mlflow_client()
    candidate, holder = _resolve(request, client)
    requests = _gate_requests(request, engine, candidate)  # every check before any load
    settings = GateSettings(
        metric=request.metric,
        alpha=request.alpha,
        seed=request.seed,
        engine=engine,
        output_root=output_root or vfops_home() / "promotions",
        reuse=request.reuse,
    )
    results = await _run_gates(request, requests, candidate, holder, settings)
    from_version = holder.version if holder else None
    outcome, reason = _decide(request, results, candidate.version, from_version)
    evidence = _evidence_doc(request, results, requests, engine)
    decision = PromotionDecision(
        name=request.name,
        alias=request.alias,
        from_version=from_version,
        to_version=candidate.version,
        outcome=outcome,
        forced=request.force,
        metric=request.metric,
        actor=request.actor or default_actor(),
        reason=reason,
        envs=results,
    )
    return await _record(decision, evidence, engine, client)


promote = blocking_twin(promote_async)
"""Synchronous :func:`promote_async` (same arguments)."""


def _check_request(request: PromotionRequest) -> None:
    from vfops.evaluation import EvalRequest

    # the gate's request, validated as an eval request is
    EvalRequest(
        env_name=request.name,
        model=request.name,
        num_examples=request.num_examples,
        rollouts_per_example=request.rollouts_per_example,
        sampling_args=dict(request.sampling_args or {}),
    ).validate()


def _normalised(request: PromotionRequest) -> PromotionRequest:
    """The request with its defaults filled: a str version, an actor, no duplicate env."""
    return replace(
        request,
        version=str(request.version),
        actor=request.actor or default_actor(),
        gate_envs=list(dict.fromkeys(request.gate_envs)),
    )


def _resolve(
    request: PromotionRequest, client: Any
) -> tuple[ModelVersionInfo, ModelVersionInfo | None]:
    """The candidate version and the alias's current holder (None: the alias is free)."""
    from mlflow.exceptions import MlflowException

    name, alias = request.name, request.alias
    candidate = resolve_version(f"models:/{name}/{request.version}", client)
    try:
        holder: ModelVersionInfo | None = ModelVersionInfo.from_mlflow(
            client.get_model_version_by_alias(name, alias)
        )
    except MlflowException:
        holder = None
    if holder is not None and holder.version == candidate.version:
        raise VfopsError(
            f"{name} version {request.version} already holds @{alias}; nothing to promote"
        )
    return candidate, holder


def _gate_requests(
    request: PromotionRequest, engine: Engine, candidate: ModelVersionInfo
) -> list[GateRequest]:
    """One gate request per environment: an evidence run's, or the promotion's."""
    envs = list(request.gate_envs)
    if not envs and not request.force:
        raise VfopsError(
            "no gate environment: pass --env ENV (repeatable), or --force to promote "
            "without evidence (recorded as forced)"
        )
    given = dict(request.evidence_runs or {})
    unknown = sorted(set(given) - set(envs))
    if unknown:
        raise VfopsError(
            f"evidence run given for {unknown[0]!r}, which is not a gate environment "
            f"({', '.join(envs) or 'none'}); add --env {unknown[0]} or drop its --run"
        )
    return [
        evidence_request(engine, env, given[env], candidate.uri)
        if env in given
        else GateRequest(
            env=env,
            num_examples=request.num_examples,
            rollouts_per_example=request.rollouts_per_example,
            sampling_args=dict(request.sampling_args or {}),
            env_args=dict((request.env_args or {}).get(env, {})),
        )
        for env in envs
    ]


async def _run_gates(
    request: PromotionRequest,
    requests: Sequence[GateRequest],
    candidate: ModelVersionInfo,
    holder: ModelVersionInfo | None,
    settings: GateSettings,
) -> list[EnvGateResult]:
    given = dict(request.evidence_runs or {})
    results: list[EnvGateResult] = []
    for gate in requests:
        if gate.env in given:
            run = GateRun(given[gate.env], reused=True)
        else:
            run = await evaluate_gate(gate, candidate, settings)
        results.append(await gate_one_env(gate, run, holder, settings))
    return results


def _decide(
    request: PromotionRequest,
    results: Sequence[EnvGateResult],
    candidate: str,
    from_version: str | None,
) -> tuple[Outcome, str]:
    """The outcome and its one-line reason: promoted unless a gate environment regressed
    or was inconclusive (``force`` promotes anyway, saying so)."""
    metric, subject, force = request.metric, request.subject, request.force
    failed = [r for r in results if r.regressed]
    inconclusive = [r for r in results if r.inconclusive]
    if failed or inconclusive:
        detail = "; ".join(
            [
                f"{r.env} regressed: {metric} {r.holder_mean:.3f} -> {r.candidate_mean:.3f} "
                f"(delta {r.delta:+.3f}, {r.verdict})"
                for r in failed
            ]
            + [inconclusive_detail(r, candidate, from_version) for r in inconclusive]
        )
        if force:
            return "promoted", (
                f"{subject} FORCED over a failed gate (holder v{from_version}): {detail}"
            )
        fix = (
            "fix the errors' cause (vfops runs show RUN --failed) and promote again"
            if inconclusive
            else "improve the candidate"
        )
        return "refused", (
            f"refused {subject} (holder v{from_version}): {detail}; "
            f"{fix}, or pass --force (recorded as forced)"
        )
    if not request.gate_envs:
        return "promoted", f"{subject} FORCED without gate environments"
    if from_version is None:
        return "promoted", (
            f"{subject}: no previous holder; evaluated on {', '.join(request.gate_envs)}"
        )
    deltas = ", ".join(f"{r.env} {metric} delta {r.delta:+.3f} ({r.verdict})" for r in results)
    reason = f"{subject} (was v{from_version}): gate passed: {deltas}"
    return "promoted", reason + (" [--force given]" if force else "")


def _evidence_doc(
    request: PromotionRequest,
    results: Sequence[EnvGateResult],
    requests: Sequence[GateRequest],
    engine: Engine,
) -> dict[str, Any]:
    """What the ``alias_events`` row keeps as the decision's evidence."""
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
    return {
        "envs": evidence,
        # what the gate's runs cost (None: nothing priced, e.g. in-process models)
        "cost_usd": runs_cost(engine, gate_runs),
        "num_examples": request.num_examples,
        "rollouts_per_example": request.rollouts_per_example,
        "sampling_args": dict(request.sampling_args or {}),
        "alpha": request.alpha,
        "seed": request.seed,
        "reuse": request.reuse,
    }


async def _record(
    decision: PromotionDecision, evidence: dict[str, Any], engine: Engine, client: Any
) -> PromotionDecision:
    """Append the decision to ``alias_events`` and, when promoted, move the alias."""
    from vfops.registry import AliasEvent, record_alias_event, session_scope

    event = AliasEvent(
        actor=decision.actor,
        model_name=decision.name,
        alias=decision.alias,
        from_version=decision.from_version,
        to_version=decision.to_version,
        outcome=decision.outcome,
        forced=decision.forced,
        metric=decision.metric,
        evidence=evidence,
        reason=decision.reason,
    )
    # One transaction: the row is committed only if the alias move succeeded.
    with session_scope(engine) as session:
        row = record_alias_event(session, event)
        event_id = int(row.id)
        if decision.promoted:
            await asyncio.to_thread(
                client.set_registered_model_alias,
                decision.name,
                decision.alias,
                decision.to_version,
            )
    return replace(decision, event_id=event_id)


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
