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

A decision is a compare-and-set on the alias's holder. The gate runs without a lock
(minutes); then, under the registry's lock on moves of that alias
(:func:`vfops.registry.lock_alias`), the holder is read again from MLflow: only if it
is still the version the gate compared with is the decision recorded and the alias
moved, in that one locked transaction. Otherwise (another promotion moved it
meanwhile) nothing is written, and the gate runs again against the new holder (the
candidate's runs are kept; the holder's are usually reused), up to
``MAX_GATE_ROUNDS`` times before refusing. So two promotions at once give one
champion, and no two recorded moves replace the same holder.

Where the truth lives: the MLflow alias is what serving resolves
(``models:/NAME@ALIAS``); ``alias_events`` is its history. Both change together under
the lock (the row commits only after the move succeeded; a failed commit moves the
alias back), and a holder the history did not put there is recorded as an
``external`` move before the next decision, so the history's chain of holders is the
alias's.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from vfops._errors import VfopsError
from vfops._settings import vfops_home
from vfops._twins import blocking_twin
from vfops.checkpoints import ModelVersionInfo, resolve_version
from vfops.models._evidence_tags import tag_promoted_version
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

    from vfops.registry import AliasEvent

log = logging.getLogger("vfops.models")

Outcome = Literal["promoted", "refused"]

MAX_GATE_ROUNDS = 5
"""How many times one promotion gates its candidate: against the holder it found, then
against each version that took the alias while the gate ran, before it refuses."""

BARRIER_VAR = "VFOPS_TEST_PROMOTION_BARRIER"
"""Test hook (never set outside tests): a folder. Each gate round, just before taking
the alias's lock, the promotion creates ``ready-<pid>`` there and waits until ``go``
exists, so that a test lines concurrent promotions up at the move. Then, under the
lock, having read the holder, it creates ``read-<pid>`` and waits up to
``_WINDOW_S`` for another process's ``read-*``: what a competitor without the lock
would do in that window is then certain to happen (the lock is what a test sees)."""
_BARRIER_TIMEOUT_S = 300.0
_WINDOW_S = 2.0


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


class AliasContendedError(VfopsError):
    """The alias changed holder during every one of ``MAX_GATE_ROUNDS`` gate rounds."""

    exit_code = 4  # busy: another process holds what this one needs (vfops/cli/_exit_codes)


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
    runs = await _candidate_runs(request, requests, candidate, settings)
    replaced: list[str | None] = []  # holders that lost the alias while the gate ran
    for _ in range(MAX_GATE_ROUNDS):
        results = [
            await gate_one_env(gate, run, holder, settings)
            for gate, run in zip(requests, runs, strict=True)
        ]
        decision = _decision(request, results, candidate, holder, replaced)
        evidence = _evidence_doc(request, results, requests, engine, replaced)
        if barrier := os.environ.get(BARRIER_VAR):
            await asyncio.to_thread(_test_barrier, barrier)
        outcome = await _record_if_holder(decision, evidence, engine, client)
        if isinstance(outcome, PromotionDecision):
            if outcome.promoted:  # recorded and moved: the version names its evidence
                await asyncio.to_thread(tag_promoted_version, client, engine, outcome)
            return outcome
        replaced.append(decision.from_version)
        holder = outcome
        _check_not_holder(request, candidate, holder)
    raise AliasContendedError(
        f"{request.name}@{request.alias} changed holder during each of {MAX_GATE_ROUNDS} "
        f"gate rounds ({' -> '.join(_label(v) for v in [*replaced, _version(holder)])}); "
        "nothing recorded: promote again once the other promotions are done"
    )


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
    name, alias = request.name, request.alias
    candidate = resolve_version(f"models:/{name}/{request.version}", client)
    holder = _holder(client, name, alias)
    if holder is not None and holder.version == candidate.version:
        raise VfopsError(
            f"{name} version {request.version} already holds @{alias}; nothing to promote"
        )
    return candidate, holder


def _holder(client: Any, name: str, alias: str) -> ModelVersionInfo | None:
    """The version holding ``name@alias`` in MLflow now (None: the alias is free)."""
    from mlflow.exceptions import MlflowException

    try:
        return ModelVersionInfo.from_mlflow(client.get_model_version_by_alias(name, alias))
    except MlflowException:
        return None


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


async def _candidate_runs(
    request: PromotionRequest,
    requests: Sequence[GateRequest],
    candidate: ModelVersionInfo,
    settings: GateSettings,
) -> list[GateRun]:
    """The candidate's run on each gate environment: given, reused or evaluated once
    (kept when the gate runs again against a new holder)."""
    given = dict(request.evidence_runs or {})
    runs: list[GateRun] = []
    for gate in requests:
        if gate.env in given:
            runs.append(GateRun(given[gate.env], reused=True))
        else:
            runs.append(await evaluate_gate(gate, candidate, settings))
    return runs


def _decision(
    request: PromotionRequest,
    results: list[EnvGateResult],
    candidate: ModelVersionInfo,
    holder: ModelVersionInfo | None,
    replaced: Sequence[str | None],
) -> PromotionDecision:
    """The decision of one gate round against ``holder``; its reason says which
    holders were replaced while the gate ran (the gate then ran again)."""
    from_version = _version(holder)
    outcome, reason = _decide(request, results, candidate.version, from_version)
    if replaced:
        chain = " -> ".join(_label(v) for v in [*replaced, from_version])
        reason += (
            f" [the holder changed while the gate ran ({chain}): "
            f"gated again against {_label(from_version)}]"
        )
    return PromotionDecision(
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


def _version(holder: ModelVersionInfo | None) -> str | None:
    return holder.version if holder is not None else None


def _label(version: str | None) -> str:
    return f"v{version}" if version is not None else "no holder"


def _check_not_holder(
    request: PromotionRequest, candidate: ModelVersionInfo, holder: ModelVersionInfo | None
) -> None:
    if holder is not None and holder.version == candidate.version:
        raise VfopsError(
            f"{request.name} version {candidate.version} took @{request.alias} while this "
            "gate ran (another promotion moved it); nothing to promote"
        )


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
    replaced: Sequence[str | None] = (),
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
        # holders that lost the alias while the gate ran (the gate then ran again)
        "replaced_during_gate": list(replaced),
    }


async def _record_if_holder(
    decision: PromotionDecision, evidence: dict[str, Any], engine: Engine, client: Any
) -> PromotionDecision | ModelVersionInfo | None:
    """The compare-and-set: under the alias's lock, record the decision and (when
    promoted) move the alias, only if the alias is still held by the version the gate
    compared with (``decision.from_version``).

    Returns the recorded decision, or the alias's new holder (None: now free) when it
    changed: then nothing is written.
    """
    from vfops.registry import lock_alias, record_alias_event, recorded_holder, session_scope

    name, alias = decision.name, decision.alias
    moved = False
    try:
        with session_scope(engine) as session:
            lock_alias(session, name, alias)  # released when this transaction ends
            holder = await asyncio.to_thread(_holder, client, name, alias)
            if barrier := os.environ.get(BARRIER_VAR):
                await asyncio.to_thread(_test_window, barrier)
            if _version(holder) != decision.from_version:
                return holder
            history = recorded_holder(session, name, alias)
            if holder is not None and history != holder.version:
                record_alias_event(session, _external_move(decision, history, holder.version))
            row = record_alias_event(session, _event(decision, evidence))
            event_id = int(row.id)
            if decision.promoted:
                await asyncio.to_thread(
                    client.set_registered_model_alias, name, alias, decision.to_version
                )
                moved = True
    except BaseException:
        if moved:  # the row did not commit: the alias goes back to the holder it replaced
            await asyncio.to_thread(_restore_alias, client, decision)
        raise
    return replace(decision, event_id=event_id)


def _event(decision: PromotionDecision, evidence: dict[str, Any]) -> AliasEvent:
    from vfops.registry import AliasEvent

    return AliasEvent(
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


def _external_move(decision: PromotionDecision, history: str | None, holder: str) -> AliasEvent:
    """The move the history lacks: the alias is on ``holder``, not where the last
    recorded move put it."""
    from vfops.registry import AliasEvent

    where = f"v{history}" if history is not None else "nowhere (no move recorded)"
    return AliasEvent(
        actor="unknown",
        model_name=decision.name,
        alias=decision.alias,
        from_version=history,
        to_version=holder,
        outcome="external",
        forced=False,
        metric=decision.metric,
        evidence={},
        reason=(
            f"@{decision.alias} was found on v{holder} while the history left it {where}: "
            "moved outside vfops promote, or by a promotion that died before recording it "
            f"(found by {decision.actor}'s promotion of v{decision.to_version})"
        ),
    )


def _restore_alias(client: Any, decision: PromotionDecision) -> None:
    """Best effort: the error that made the record fail is the one the caller sees.
    (Should this fail too, the next promotion records the holder as ``external``.)"""
    try:
        if decision.from_version is None:
            client.delete_registered_model_alias(decision.name, decision.alias)
        else:
            client.set_registered_model_alias(decision.name, decision.alias, decision.from_version)
    except Exception as exc:
        log.warning(
            "could not move %s@%s back to %s after its record failed: %s",
            decision.name,
            decision.alias,
            _label(decision.from_version),
            exc,
        )


def _test_window(folder: str) -> None:
    """See :data:`BARRIER_VAR`."""
    mine = f"read-{os.getpid()}"
    Path(folder, mine).touch()
    deadline = time.monotonic() + _WINDOW_S
    while time.monotonic() < deadline:
        if any(path.name != mine for path in Path(folder).glob("read-*")):
            return
        time.sleep(0.01)


def _test_barrier(folder: str) -> None:
    """See :data:`BARRIER_VAR`."""
    Path(folder, f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + _BARRIER_TIMEOUT_S
    while not Path(folder, "go").exists():
        if time.monotonic() > deadline:
            raise VfopsError(f"{BARRIER_VAR}: {folder}/go did not appear in 300 s")
        time.sleep(0.01)


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
