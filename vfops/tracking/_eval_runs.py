"""Eval runs as MLflow runs, through an explicit ``MlflowClient`` (no global active run).

Only the MLflow side lives here (experiments, runs, params, metrics, artifacts, the
sweep's parent runs). What is read of a registry run is :mod:`vfops.tracking._run_info`'s,
and the rollouts' parquet artifact is written by :mod:`vfops.tracking._parquet`, so
the tracker process that logs a run described in JSON needs neither.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from vfops.tracking._client import ensure_experiment, mlflow_client, quiet, safe_folder
from vfops.tracking._inputs import log_rows_dataset, log_run_inputs
from vfops.tracking._lifeline import HOLDER_TAG, RunTakenOver
from vfops.tracking._parquet import ARTIFACT_NAME, arrow_to_parquet
from vfops.tracking._run_info import RunInfo, link_mlflow_run, prepare_run_log

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from sqlalchemy.engine import Engine


RUN_ID_TAG: Final = "vfops.run_id"
SWEEP_TAG: Final = "vfops.sweep"
PARENT_TAG: Final = "mlflow.parentRunId"
_BATCH_PARAMS: Final = 100
_BATCH_METRICS: Final = 1000
_MLFLOW_STATUS: Final = {
    "completed": "FINISHED",
    "failed": "FAILED",
    "interrupted": "KILLED",
    "budget_exhausted": "KILLED",  # stopped by its cost cap; resumable
}
# MLflow's SQL store is not safe for concurrent writers on SQLite; one logger at a time.
_lock = threading.Lock()


def tracking_enabled() -> bool:
    """False when ``VFOPS_TRACKING`` is ``0``/``false``/``off``/``no``."""
    value = os.environ.get("VFOPS_TRACKING", "").strip().lower()
    return value not in ("0", "false", "off", "no")


def experiment_name(env_name: str) -> str:
    return f"vfops/{env_name}"


def run_name(info: dict[str, Any]) -> str:
    """The MLflow run name of a registry run (:func:`prepare_run_log`'s ``info``)."""
    return f"{info['env_name']}@{info['env_version']} {info['model']} {str(info['id'])[:8]}"


def _experiment_id(client: MlflowClient, env_name: str) -> str:
    # artifacts in a folder per environment (the experiment name holds a slash)
    folder = safe_folder(env_name)
    return ensure_experiment(client, experiment_name(env_name), artifact_folder=folder)


def _ms(moment: dt.datetime | None) -> int | None:
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


def _metrics_from_stored(stored: dict[str, Any]) -> dict[str, float]:
    """The metrics of :func:`_metrics`, from a run's stored summary (``EvalSummary.to_dict``)."""
    rollouts = int(stored.get("rollouts") or 0)
    scored = int(stored.get("scored") or 0)
    errors = int(stored.get("errors") or 0)
    prompt, completion = (
        int(stored.get("prompt_tokens") or 0),
        int(stored.get("completion_tokens") or 0),
    )
    metrics: dict[str, float] = {
        "rollouts": float(rollouts),
        "scored_rollouts": float(scored),
        "errors": float(errors),
        "error_rate": errors / rollouts if rollouts else 0.0,
        "truncated": float(stored.get("truncated") or 0),
        "prompt_tokens": float(prompt),
        "completion_tokens": float(completion),
        "total_tokens": float(prompt + completion),
    }
    if stored.get("tool_calls") is not None:  # absent from a summary stored before them
        calls, tool_errors = int(stored["tool_calls"]), int(stored.get("tool_errors") or 0)
        metrics["tool_calls"] = float(calls)
        metrics["tool_errors"] = float(tool_errors)
        metrics["tool_error_rate"] = tool_errors / calls if calls else 0.0
    if stored.get("cost_usd") is not None:  # unpriced: no metric, never a 0
        metrics["cost_usd"] = float(stored["cost_usd"])
    if scored:
        for key in ("reward_mean", "reward_std", "reward_stderr"):
            metrics[key] = float(stored.get(key) or 0.0)
    for name, mean in sorted((stored.get("metrics") or {}).items()):
        metrics[f"metric/{_metric_name(name)}"] = float(mean)
    for k, value in (stored.get("pass_at_k") or {}).items():
        metrics[f"pass_at_{k}"] = float(value)
    for name, agent in sorted((stored.get("agents") or {}).items()):
        if agent.get("scored"):  # the seat's mean reward, in an episode of several agents
            metrics[f"agent/{_metric_name(name)}/reward_mean"] = float(agent["reward_mean"])
    for key in ("rollouts_per_s", "wall_s"):
        stored_value = stored.get(key)
        if isinstance(stored_value, int | float):
            metrics[key] = float(stored_value)
    return metrics


def _metric_name(name: str) -> str:
    return re.sub(r"[^\w.\- /:]", "_", name)


def _find_mlflow_run(client: MlflowClient, experiment_id: str, info: RunInfo) -> Any | None:
    """The MLflow run already recorded for ``info`` (by its stored id, else by tag)."""
    from mlflow.exceptions import MlflowException

    if info.mlflow_run_id:
        try:
            run = client.get_run(info.mlflow_run_id)
        except MlflowException:
            run = None  # e.g. another tracking store than the one it was logged to
        if run is not None and run.info.lifecycle_stage != "deleted":
            return run
    found = client.search_runs(
        [experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{info.id}'", max_results=1
    )
    return found[0] if found else None


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def log_eval_run(
    engine: Engine,
    run_id: str,
    *,
    parent_run_id: str | None = None,
    client: MlflowClient | None = None,
    rollouts_file: str | Path | None = None,
) -> str:
    """Log registry run ``run_id`` as an MLflow run; return the MLflow run id.

    Experiment ``vfops/<environment>``; params from the registry row only (it holds no
    keys); metrics computed from the run's rollouts, streamed from the registry into
    a ``rollouts.parquet`` artifact; tags link the registry run. The MLflow run id is
    then stored on the registry run. Logging the same run again reuses its MLflow run
    (new metric values, the artifact replaced). ``parent_run_id`` nests a new run
    under a sweep's parent run. ``rollouts_file``: the evaluation's own Arrow export
    of the whole run; the artifact is then converted from it, and the metrics taken
    from the run's stored summary, instead of reading every rollout back.
    """
    with tempfile.TemporaryDirectory(prefix="vfops-mlflow-") as folder:
        info, rollouts = prepare_run_log(engine, run_id, Path(folder), rollouts_file)
        mlflow_id = log_run_info(
            info, parent_run_id=parent_run_id, client=client, rollouts_file=rollouts
        )
    if info["mlflow_run_id"] != mlflow_id:
        link_mlflow_run(engine, run_id, mlflow_id)
    return mlflow_id


def log_run_info(
    info: dict[str, Any],
    *,
    parent_run_id: str | None = None,
    client: MlflowClient | None = None,
    rollouts_file: str | Path,
) -> str:
    """Log a run described by :func:`prepare_run_log` and its rollouts file (Arrow or
    parquet), and its rollouts as traces (:mod:`vfops.tracking._traces`); MLflow only,
    so the tracker process needs no registry. Returns the MLflow run id (the caller
    links it: :func:`link_mlflow_run`)."""
    mlflow_id, traces = log_run_deferring_traces(
        info, parent_run_id=parent_run_id, client=client, rollouts_file=rollouts_file
    )
    if traces is not None:
        traces.log()
    return mlflow_id


@dataclass
class PendingTraces:
    """The rollouts of a logged run still to log as traces (read from its rollouts file
    already: the file may be gone by the time they are logged)."""

    records: list[Any]
    tracking_uri: str
    experiment_id: str
    mlflow_run_id: str
    tags: dict[str, str]
    pass_threshold: float
    skip_logged: bool

    def log(self) -> int:
        """Log them; return how many traces were logged."""
        from vfops.tracking._trace_batch import TraceWriter

        with _lock, quiet():
            writer = TraceWriter(
                tracking_uri=self.tracking_uri,
                experiment_id=self.experiment_id,
                mlflow_run_id=self.mlflow_run_id,
                tags=self.tags,
                pass_threshold=self.pass_threshold,
                skip_logged=self.skip_logged,
            )
            return writer.log(self.records)


def log_run_deferring_traces(
    info: dict[str, Any],
    *,
    parent_run_id: str | None = None,
    client: MlflowClient | None = None,
    rollouts_file: str | Path,
) -> tuple[str, PendingTraces | None]:
    """:func:`log_run_info` without the traces: the MLflow run id, and the traces to log
    (``None``: none, e.g. ``VFOPS_TRACE_ROLLOUTS=off``), for a caller that answers first."""
    with _lock, quiet():
        return _log_run_info(RunInfo.from_json(info), parent_run_id, client, Path(rollouts_file))


def prepare_experiment(env_name: str, client: MlflowClient | None = None) -> str:
    """Create (or find) the experiment of ``env_name`` ahead of its first run."""
    with _lock, quiet():
        return _experiment_id(client or mlflow_client(), env_name)


def _run_tags(info: RunInfo) -> dict[str, str]:
    tags = {
        RUN_ID_TAG: info.id,
        "vfops.version": info.vfops_version,
        "vfops.environment": info.env_name,
        "vfops.environment_version": info.env_version,
        "vfops.published": str(info.published).lower(),
        "vfops.status": info.status,
    }
    if info.tags:
        tags["vfops.tags"] = ",".join(str(t) for t in info.tags)
    tags.update(info.prefect_tags)
    return tags


@dataclass(frozen=True)
class OpenedRun:
    """An eval run's MLflow run, open (created or found again) and ready for its rollouts."""

    mlflow_run_id: str
    experiment_id: str
    logged_before: bool
    """It existed already (a resumed run): its traces are skipped when logged again."""


def open_mlflow_run(
    info: dict[str, Any],
    *,
    parent_run_id: str | None = None,
    client: MlflowClient | None = None,
    holder: str | None = None,
) -> OpenedRun:
    """Create (or find again, by the registry run's tag) the MLflow run of ``info``
    (:func:`prepare_run_log`) and log its params and tags; status ``RUNNING`` until
    :func:`finish_mlflow_run`. ``holder``: the lease owner of the evaluation that opens
    it, written as its :data:`HOLDER_TAG` (the run's end is then written only while
    the tag still names it)."""
    with _lock, quiet():
        client = client or mlflow_client()
        return _open_run(RunInfo.from_json(info), parent_run_id, client, holder)


def _open_run(
    info: RunInfo, parent_run_id: str | None, client: MlflowClient, holder: str | None = None
) -> OpenedRun:
    from mlflow.entities import Param, RunTag

    experiment_id = _experiment_id(client, info.env_name)
    run = _find_mlflow_run(client, experiment_id, info)
    tags = _run_tags(info)
    if holder is not None:
        tags[HOLDER_TAG] = holder
    logged_before = run is not None
    if run is None:
        if parent_run_id:
            tags[PARENT_TAG] = parent_run_id
        run = client.create_run(
            experiment_id,
            start_time=_ms(info.started_at),
            tags=tags,
            run_name=run_name(info.to_json()),
        )
    else:
        if parent_run_id and PARENT_TAG not in run.data.tags:
            tags[PARENT_TAG] = parent_run_id
        if run.info.status != "RUNNING":  # resumed: running again until it finishes
            client.update_run(run.info.run_id, status="RUNNING")
    mlflow_id: str = run.info.run_id
    logged = run.data.params
    params = [Param(k, v) for k, v in info.params().items() if k not in logged]
    client.log_batch(
        mlflow_id, params=params[:_BATCH_PARAMS], tags=[RunTag(k, v) for k, v in tags.items()]
    )
    for extra in _chunks(params[_BATCH_PARAMS:], _BATCH_PARAMS):
        client.log_batch(mlflow_id, params=list(extra))
    log_run_inputs(client, run, info)  # the dataset snapshot and the model version
    return OpenedRun(mlflow_id, experiment_id, logged_before)


def log_progress(
    mlflow_run_id: str,
    stored: dict[str, Any],
    step: int,
    *,
    client: MlflowClient | None = None,
) -> None:
    """Log the statistics of a run still running (its summary so far,
    ``EvalSummary.to_dict``) at ``step`` (the rollouts done): the run's curves grow
    while it runs, and the last value is the final one."""
    from mlflow.entities import Metric

    now = _ms(dt.datetime.now(dt.UTC)) or 0
    metrics = [Metric(k, v, now, step) for k, v in _metrics_from_stored(stored).items()]
    with _lock, quiet():
        client = client or mlflow_client()
        for chunk in _chunks(metrics, _BATCH_METRICS):
            client.log_batch(mlflow_run_id, metrics=list(chunk))


def finish_mlflow_run(
    opened: OpenedRun,
    info: dict[str, Any],
    *,
    rollouts_file: str | Path | None,
    step: int = 0,
    client: MlflowClient | None = None,
    holder: str | None = None,
) -> None:
    """Record how the run ended: its rollouts as a ``rollouts.parquet`` artifact (from an
    Arrow stream or a parquet; none for a run that did not complete), its final metrics at
    ``step``, its status tag and MLflow status. ``holder`` (the lease owner that opened
    it): raises :class:`RunTakenOver`, having written nothing, once the run's
    :data:`HOLDER_TAG` names another."""
    with _lock, quiet():
        client = client or mlflow_client()
        _finish_run(RunInfo.from_json(info), opened, rollouts_file, step, client, holder)


def check_holder(
    mlflow_run_id: str, holder: str | None, client: MlflowClient | None = None
) -> None:
    """Raise :class:`RunTakenOver` when the MLflow run's :data:`HOLDER_TAG` names another
    holder than ``holder`` (None: nothing to check, e.g. a run logged after the fact)."""
    if holder is None:
        return
    with quiet():
        client = client or mlflow_client()
        current = client.get_run(mlflow_run_id).data.tags.get(HOLDER_TAG)
    if current is not None and current != holder:
        raise RunTakenOver(mlflow_run_id, current)


def end_killed(mlflow_run_id: str, holder: str | None, client: MlflowClient | None = None) -> bool:
    """End the MLflow run ``KILLED`` (its evaluation died) unless another holder took it
    over, or it ended already; whether it was ended."""
    with _lock, quiet():
        client = client or mlflow_client()
        try:
            check_holder(mlflow_run_id, holder, client)
        except RunTakenOver:
            return False
        if client.get_run(mlflow_run_id).info.status != "RUNNING":
            return False
        client.set_terminated(mlflow_run_id, status="KILLED")
        return True


def _finish_run(
    info: RunInfo,
    opened: OpenedRun,
    rollouts: str | Path | None,
    step: int,
    client: MlflowClient,
    holder: str | None = None,
) -> None:
    from mlflow.entities import Metric, RunTag

    mlflow_id = opened.mlflow_run_id
    check_holder(mlflow_id, holder, client)
    if rollouts is not None:
        rollouts = Path(rollouts)
        if rollouts.name.endswith(".parquet"):
            log_artifact_atomically(client, mlflow_id, rollouts)
        else:
            with tempfile.TemporaryDirectory(prefix="vfops-mlflow-") as folder:
                path = Path(folder) / ARTIFACT_NAME
                arrow_to_parquet(rollouts, path)
                log_artifact_atomically(client, mlflow_id, path)
        if info.dataset is None and info.status == "completed":  # no snapshot names its rows
            log_rows_dataset(client, mlflow_id, info, rollouts)
    now = _ms(dt.datetime.now(dt.UTC)) or 0
    metrics = [Metric(k, v, now, step) for k, v in _metrics_from_stored(info.summary).items()]
    client.log_batch(
        mlflow_id, metrics=metrics[:_BATCH_METRICS], tags=[RunTag("vfops.status", info.status)]
    )
    for extra in _chunks(metrics[_BATCH_METRICS:], _BATCH_METRICS):
        client.log_batch(mlflow_id, metrics=list(extra))
    status = _MLFLOW_STATUS.get(info.status)
    if status is not None:
        check_holder(mlflow_id, holder, client)  # again: as close to the write as can be
        client.set_terminated(mlflow_id, status=status, end_time=_ms(info.finished_at))


def log_artifact_atomically(client: MlflowClient, mlflow_run_id: str, path: Path) -> None:
    """``client.log_artifact``, except that a run whose artifacts are a local folder gets
    the file whole or not at all (written beside its place, synced, renamed: MLflow's
    own copy, killed midway, leaves a torn file under the artifact's name)."""
    from vfops._atomic import replace_file_atomically

    uri = str(client.get_run(mlflow_run_id).info.artifact_uri or "")
    folder = _local_folder(uri)
    if folder is None:
        client.log_artifact(mlflow_run_id, str(path))
        return
    replace_file_atomically(folder / path.name, source=path)


def _local_folder(uri: str) -> Path | None:
    """The folder of a ``file:`` (or plain path) artifact URI; None for any other store."""
    from urllib.parse import unquote, urlparse

    if uri.startswith("file:"):
        parsed = urlparse(uri)
        return Path(unquote(parsed.path)) if parsed.netloc in ("", "localhost") else None
    if uri.startswith("/"):
        return Path(uri)
    return None


def _log_run_info(
    info: RunInfo, parent_run_id: str | None, client: MlflowClient | None, rollouts: Path
) -> tuple[str, PendingTraces | None]:
    client = client or mlflow_client()
    opened = _open_run(info, parent_run_id, client)
    _finish_run(info, opened, rollouts, 0, client)
    traces = _pending_traces(
        info, client, opened.experiment_id, opened.mlflow_run_id, rollouts, opened.logged_before
    )
    return opened.mlflow_run_id, traces


def _pending_traces(
    info: RunInfo,
    client: MlflowClient,
    experiment_id: str,
    mlflow_id: str,
    rollouts: Path,
    logged_before: bool,
) -> PendingTraces | None:
    from vfops._settings import trace_rollouts
    from vfops.tracking._traces import select_rollouts

    limit = trace_rollouts()
    if limit is None or info.status != "completed":
        return None
    stored = info.summary.get("pass_threshold")
    pass_threshold = 1.0 if stored is None else float(stored)
    records = select_rollouts(rollouts, limit=limit, pass_threshold=pass_threshold)
    if not records:
        return None
    tags = {RUN_ID_TAG: info.id}  # the rest is the run's (few tags: the UI lists them all)
    return PendingTraces(
        records=records,
        tracking_uri=str(client.tracking_uri),
        experiment_id=experiment_id,
        mlflow_run_id=mlflow_id,
        tags=tags,
        pass_threshold=pass_threshold,
        skip_logged=logged_before,
    )


def start_sweep_runs(
    env_names: Sequence[str],
    *,
    sweep_name: str,
    tags: dict[str, str] | None = None,
    client: MlflowClient | None = None,
) -> dict[str, str]:
    """One parent MLflow run per environment of a sweep (in that environment's experiment,
    so the UI nests the cells under it); returns ``{env_name: parent run id}``."""
    from mlflow.entities import RunTag

    with _lock, quiet():
        client = client or mlflow_client()
        parents: dict[str, str] = {}
        for env_name in dict.fromkeys(env_names):
            experiment_id = _experiment_id(client, env_name)
            run = client.create_run(
                experiment_id,
                tags={SWEEP_TAG: sweep_name, "vfops.environment": env_name},
                run_name=f"sweep {sweep_name}",
            )
            if tags:
                client.log_batch(run.info.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
            parents[env_name] = run.info.run_id
        return parents


def finish_sweep_runs(
    parents: dict[str, str], *, failed: bool = False, client: MlflowClient | None = None
) -> None:
    """Mark the parent runs of a sweep finished (or failed)."""
    with _lock, quiet():
        client = client or mlflow_client()
        for run_id in parents.values():
            client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")
