"""The tags a promoted model version carries: the evidence its gate decided on.

``vfops promote history`` keeps every decision; these tags put the one that moved the
alias where MLflow users look, on the version itself (its page in the model registry):
the decision, and per gate environment the MLflow runs of the candidate's and the
holder's gate evals (and their registry runs), the metric's delta, its confidence
interval and the verdict. Set once the decision committed and the alias moved.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from vfops.models._promotion import PromotionDecision

log = logging.getLogger("vfops.models")

PROMOTION_TAG_PREFIX = "vfops.promotion."
"""The tags a promoted version carries: the decision, and per gate environment its
evidence runs (MLflow run ids of the candidate's and the holder's gate evals, and their
registry run ids), the metric's delta, its confidence interval and the verdict."""


def promotion_tags(decision: PromotionDecision, mlflow_runs: Mapping[str, str]) -> dict[str, str]:
    """The tags of :data:`PROMOTION_TAG_PREFIX` for a promoted ``decision``;
    ``mlflow_runs`` maps a registry run id to its MLflow run id (a run logged without
    tracking has none: its registry id is still named)."""
    p, from_version = PROMOTION_TAG_PREFIX, decision.from_version
    tags = {
        f"{p}alias": decision.alias,
        f"{p}decision": "forced" if decision.forced else decision.outcome,
        f"{p}replaced": "no holder" if from_version is None else f"v{from_version}",
        f"{p}metric": decision.metric,
        f"{p}actor": decision.actor,
        f"{p}gate_envs": ",".join(r.env for r in decision.envs),
    }
    if decision.event_id is not None:
        tags[f"{p}event_id"] = str(decision.event_id)
    for r in decision.envs:
        env = f"{p}{_tag_safe(r.env)}."
        for role, run_id in (("candidate", r.candidate_run_id), ("holder", r.holder_run_id)):
            if run_id is None:
                continue
            tags[f"{env}{role}_registry_run"] = run_id
            if run_id in mlflow_runs:
                tags[f"{env}{role}_run"] = mlflow_runs[run_id]
        tags[f"{env}candidate_mean"] = f"{r.candidate_mean:.6f}"
        if r.delta is not None:
            tags[f"{env}delta"] = f"{r.delta:+.6f}"
        if r.ci_low is not None and r.ci_high is not None:
            tags[f"{env}ci"] = f"[{r.ci_low:+.6f}, {r.ci_high:+.6f}]"
        if r.verdict is not None:
            tags[f"{env}verdict"] = r.verdict
    return tags


def tag_promoted_version(client: Any, engine: Engine, decision: PromotionDecision) -> None:
    """Tag the version ``decision`` promoted with its evidence (:func:`promotion_tags`),
    replacing the tags of an earlier promotion of it. After the decision committed and
    the alias moved: a failure here is logged, the promotion stands (its history row
    holds the same evidence)."""
    from vfops.registry import get_run, session_scope

    runs = {
        run_id
        for r in decision.envs
        for run_id in (r.candidate_run_id, r.holder_run_id)
        if run_id is not None
    }
    try:
        with session_scope(engine, write=False) as session:
            rows = {run_id: get_run(session, run_id) for run_id in sorted(runs)}
            mlflow_runs = {k: v.mlflow_run_id for k, v in rows.items() if v and v.mlflow_run_id}
        tags = promotion_tags(decision, mlflow_runs)
        name, version = decision.name, decision.to_version
        stale = client.get_model_version(name, version).tags or {}
        for key in stale:
            if key.startswith(PROMOTION_TAG_PREFIX) and key not in tags:
                client.delete_model_version_tag(name, version, key)
        for key, value in tags.items():
            client.set_model_version_tag(name, version, key, value)
    except Exception as exc:
        log.warning(
            "promoted %s v%s to @%s, but could not tag it with its evidence: %s "
            "(vfops promote history %s has it)",
            decision.name,
            decision.to_version,
            decision.alias,
            exc,
            decision.name,
        )


def _tag_safe(env: str) -> str:
    # MLflow tag keys: alphanumerics, _ - . space / only
    return re.sub(r"[^\w\-./ ]", "_", env)
