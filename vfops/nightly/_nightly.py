"""Nightly sweeps: tag the runs, find the previous night's run, compare paired.

A nightly run carries the tags ``nightly`` and ``nightly:<date>``; the date is
part of the run's fingerprint, so rerunning the same night resumes it and the
next night starts a new run. Each cell (environment, model, sampling args, N, R)
is compared with its previous completed nightly run, aligned on example_id.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vfops.evaluation import per_example_rewards
from vfops.registry import RunFilter, get_run, list_runs, session_scope
from vfops.sweeps import MODEL_REF_TAG

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

    from vfops.registry import EvalRunRow

NIGHTLY_TAG = "nightly"


def nightly_tags(day: dt.date) -> list[str]:
    return [NIGHTLY_TAG, f"{NIGHTLY_TAG}:{day.isoformat()}"]


def model_ref(run: EvalRunRow) -> str | None:
    """The registry alias (``models:/NAME@champion``) the run's model was pinned from."""
    for tag in run.tags or []:
        if tag.startswith(MODEL_REF_TAG):
            return str(tag[len(MODEL_REF_TAG) :])
    return None


def _same_model(a: EvalRunRow, b: EvalRunRow) -> bool:
    # A cell of an alias follows the alias: tonight's champion is compared with
    # last night's champion, whichever versions they were.
    ref = model_ref(a)
    return ref == model_ref(b) if ref is not None else a.model == b.model


def _same_cell(a: EvalRunRow, b: EvalRunRow) -> bool:
    return (
        a.environment_name == b.environment_name
        and _same_model(a, b)
        and a.sampling_args == b.sampling_args
        and a.env_args == b.env_args
        and a.num_examples == b.num_examples
        and a.rollouts_per_example == b.rollouts_per_example
    )


def previous_nightly_run(session: Session, run: EvalRunRow) -> EvalRunRow | None:
    """The newest completed nightly run of the same cell that started before ``run``."""
    candidates = list_runs(
        session,
        RunFilter(
            env_name=run.environment_name,
            # a cell of an alias follows the alias, whichever model it resolved to
            model=None if model_ref(run) is not None else run.model,
            status="completed",
            started_before=run.started_at,
            exclude_run_id=run.id,
            limit=200,
        ),
    )
    for candidate in candidates:
        if NIGHTLY_TAG in (candidate.tags or []) and _same_cell(candidate, run):
            return candidate
    return None


@dataclass
class CellComparison:
    """One nightly cell against its previous night."""

    label: str
    run_id: str
    previous_run_id: str | None
    previous_version: str | None
    version: str
    report: Any | None  # vfops.stats.RegressionReport; None when there is no previous run
    model: str = ""
    previous_model: str | None = None
    model_ref: str | None = None

    @property
    def regressed(self) -> bool:
        return bool(self.report is not None and self.report.regressed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "run_id": self.run_id,
            "previous_run_id": self.previous_run_id,
            "version": self.version,
            "previous_version": self.previous_version,
            "model": self.model,
            "previous_model": self.previous_model,
            "model_ref": self.model_ref,
            "regressed": self.regressed,
            "report": None if self.report is None else self.report.to_dict(),
        }


def compare_with_previous(
    engine: Engine,
    run_id: str,
    *,
    label: str | None = None,
    alpha: float = 0.05,
    pass_threshold: float | None = None,
    seed: int = 0,
) -> CellComparison:
    """Paired comparison of a nightly run with the previous nightly run of its cell."""
    from vfops.stats import compare_runs_statistically

    with session_scope(engine, write=False) as session:
        run = get_run(session, run_id, exact=True)
        if run is None:
            raise LookupError(f"no eval run {run_id}")
        previous = previous_nightly_run(session, run)
        name = label or f"{run.environment_name} · {run.model}"
        ref, model = model_ref(run), run.model
        if previous is None:
            return CellComparison(
                name, run.id, None, None, run.environment_version, None, model, None, ref
            )
        prev_id, prev_version, prev_model = (
            previous.id,
            previous.environment_version,
            previous.model,
        )
        version = run.environment_version
    if ref is not None and prev_model != model:
        name += f" ({ref}: {prev_model} -> {model})"
    report = compare_runs_statistically(
        per_example_rewards(engine, prev_id),
        per_example_rewards(engine, run_id),
        pass_threshold=pass_threshold,
        alpha=alpha,
        seed=seed,
    )
    return CellComparison(
        name, run_id, prev_id, prev_version, version, report, model, prev_model, ref
    )


def night_of(run: EvalRunRow) -> dt.date:
    """The night a nightly run was scheduled for (its ``nightly:<date>`` tag), else the
    date it started."""
    prefix = f"{NIGHTLY_TAG}:"
    for tag in run.tags or []:
        if tag.startswith(prefix):
            try:
                return dt.date.fromisoformat(tag[len(prefix) :])
            except ValueError:
                break
    return run.started_at.date()


def nightly_history(
    engine: Engine,
    env_name: str,
    *,
    limit: int = 30,
    aliases: Mapping[str, str] | None = None,
) -> dict[str, list[tuple[str, float, float]]]:
    """Per model: (night, reward mean, stderr) of completed nightly runs, oldest night
    first. The night is the date the run was scheduled for (a night that ran late or was
    re-run the next morning is still that night), as ``YYYY-MM-DD``.

    A series is named ``env · model``: the registry alias a run was pinned from, else the
    served model, renamed through ``aliases`` (served model -> the endpoint alias the
    sweep named it by, so a chart says what the tables say).
    """
    with session_scope(engine, write=False) as session:
        runs = list_runs(
            session, RunFilter(env_name=env_name, status="completed", limit=limit * 10)
        )
    history: dict[str, list[tuple[str, float, float]]] = {}
    for run in runs:
        if NIGHTLY_TAG not in (run.tags or []) or not run.summary:
            continue
        if run.summary.get("reward_mean") is None:  # nothing scored that night: no point
            continue
        model = model_ref(run) or (aliases or {}).get(run.model, run.model)
        series = history.setdefault(f"{env_name} · {model}", [])
        series.append(
            (
                night_of(run).isoformat(),
                float(run.summary["reward_mean"]),
                float(run.summary.get("reward_stderr") or 0.0),
            )
        )
    return {name: sorted(series)[-limit:] for name, series in history.items()}
