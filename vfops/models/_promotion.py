"""Evidence-gated promotion of a model version to an alias (``champion``).

The candidate and the current alias holder are evaluated in-process
(:class:`vfops.local.LocalModelClient`) on every gate environment with the same
request (examples, rollouts, sampling arguments, seed); both runs are recorded
in the vfops registry, so the evidence has run ids. Per environment, the
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
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from vfops._errors import VfopsError
from vfops._settings import vfops_home
from vfops.models._checkpoints import ModelVersionInfo, load_model_dir, resolve_version
from vfops.models._mlflow import mlflow_client

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from vfops.stats import RegressionReport

Outcome = Literal["promoted", "refused"]

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


def _generation_cap(model_dir: Path, default: int = 64) -> int:
    """The checkpoint's own ``max_new_tokens`` (generation_config.json), else ``default``."""
    try:
        data = json.loads((model_dir / "generation_config.json").read_text())
    except (OSError, ValueError):
        return default
    value = data.get("max_new_tokens") if isinstance(data, dict) else None
    return int(value) if isinstance(value, int) and value > 0 else default


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


async def _evaluate(
    env_name: str,
    model_uri: str,
    model_dir: Path,
    *,
    num_examples: int,
    rollouts_per_example: int,
    sampling_args: Mapping[str, Any],
    env_args: Mapping[str, Any],
    seed: int,
    tag: str,
    engine: Engine,
    output_root: Path,
) -> str:
    from vfops.envs import load_environment
    from vfops.evaluation import EvalRequest
    from vfops.evaluation._tracked import run_tracked_eval_async
    from vfops.local import LocalModelClient

    env = load_environment(env_name, **dict(env_args))
    request = EvalRequest(
        env_name=env_name,
        model=model_uri,
        num_examples=num_examples,
        rollouts_per_example=rollouts_per_example,
        sampling_args=dict(sampling_args),
        env_args=dict(env_args),
        tags=[PROMOTION_TAG, tag],
    )
    request.validate()
    client = await asyncio.to_thread(
        LocalModelClient,
        model_dir,
        seed=seed,
        max_new_tokens_default=_generation_cap(model_dir),
    )
    try:
        tracked, result = await run_tracked_eval_async(
            env, client, request, output_root=output_root, engine=engine
        )
    finally:
        await client.aclose()
    if result.status != "completed":
        raise VfopsError(
            f"gate eval of {model_uri} on {env_name} ended {result.status} "
            f"(run {tracked.run_id}); fix it and promote again"
        )
    return tracked.run_id


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
) -> PromotionDecision:
    """Evaluate, compare, decide, record; see the module docstring.

    Returns the decision (``outcome`` ``"promoted"`` or ``"refused"``; call
    :meth:`PromotionDecision.raise_if_refused` to turn a refusal into an error).
    ``env_args`` maps a gate environment to its ``load_environment`` arguments.
    """
    from mlflow.exceptions import MlflowException

    from vfops.registry import get_engine, session_scope
    from vfops.registry._models import AliasEvent
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

    candidate_dir = await asyncio.to_thread(load_model_dir, candidate.uri)
    holder_dir = await asyncio.to_thread(load_model_dir, holder.uri) if holder else None
    tag = f"promotion:{name}@{alias}:{version}"
    results: list[EnvGateResult] = []
    for env_name in envs:
        common: dict[str, Any] = {
            "num_examples": num_examples,
            "rollouts_per_example": rollouts_per_example,
            "sampling_args": dict(sampling_args or {}),
            "env_args": dict((env_args or {}).get(env_name, {})),
            "seed": seed,
            "tag": tag,
            "engine": engine,
            "output_root": output_root,
        }
        cand_run = await _evaluate(env_name, candidate.uri, candidate_dir, **common)
        cand_values = metric_values(engine, cand_run, metric)
        if holder is None or holder_dir is None:
            results.append(EnvGateResult(env_name, cand_run, _mean(cand_values)))
            continue
        holder_run = await _evaluate(env_name, holder.uri, holder_dir, **common)
        holder_values = metric_values(engine, holder_run, metric)
        report: RegressionReport = compare_runs_statistically(
            holder_values, cand_values, alpha=alpha, seed=seed
        )
        results.append(
            EnvGateResult(
                env=env_name,
                candidate_run_id=cand_run,
                candidate_mean=report.mean_b,
                holder_run_id=holder_run,
                holder_mean=report.mean_a,
                delta=report.delta,
                verdict=report.verdict,
                regressed=report.regressed,
                summary=report.summary,
            )
        )

    failed = [r for r in results if r.regressed]
    from_version = holder.version if holder else None
    subject = f"{name} v{version} -> @{alias}"
    if failed:
        detail = "; ".join(
            f"{r.env} regressed: {metric} {r.holder_mean:.3f} -> {r.candidate_mean:.3f} "
            f"(delta {r.delta:+.3f}, {r.verdict})"
            for r in failed
        )
        if force:
            outcome: Outcome = "promoted"
            reason = f"{subject} FORCED over a failed gate (holder v{from_version}): {detail}"
        else:
            outcome = "refused"
            reason = (
                f"refused {subject} (holder v{from_version}): {detail}; "
                "improve the candidate, or pass --force (recorded as forced)"
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
        }
        for r in results
    }
    evidence_doc: dict[str, Any] = {
        "envs": evidence,
        "num_examples": num_examples,
        "rollouts_per_example": rollouts_per_example,
        "sampling_args": dict(sampling_args or {}),
        "alpha": alpha,
        "seed": seed,
    }
    # One transaction: the row is committed only if the alias move succeeded.
    with session_scope(engine) as session:
        row = AliasEvent(
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
        session.add(row)
        session.flush()
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


def promote(
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
) -> PromotionDecision:
    """Synchronous :func:`promote_async`."""
    return asyncio.run(
        promote_async(
            name,
            version,
            alias=alias,
            gate_envs=gate_envs,
            num_examples=num_examples,
            rollouts_per_example=rollouts_per_example,
            metric=metric,
            force=force,
            actor=actor,
            sampling_args=sampling_args,
            env_args=env_args,
            alpha=alpha,
            seed=seed,
            engine=engine,
            output_root=output_root,
        )
    )


def promotion_history(
    name: str, *, alias: str | None = None, engine: Engine | None = None
) -> list[AliasEventInfo]:
    """Every recorded decision on model ``name`` (optionally one alias), oldest first."""
    from sqlalchemy import select

    from vfops.registry import get_engine, session_scope
    from vfops.registry._models import AliasEvent

    engine = engine or get_engine()
    query = select(AliasEvent).where(AliasEvent.model_name == name)
    if alias is not None:
        query = query.where(AliasEvent.alias == alias)
    with session_scope(engine, write=False) as session:
        rows = session.scalars(query.order_by(AliasEvent.id)).all()
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
