"""Training runs in MLflow: params from the config, per-step metrics with ``log_batch``.

Uses the same store as checkpoints (``vfops.tracking``: ``MLFLOW_TRACKING_URI``
or the embedded SQLite store under VFOPS_HOME). mlflow is imported inside functions.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from vfops.tracking import ensure_experiment, mlflow_client, prefect_run_tags
from vfops.tracking import flatten_params as _flatten

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from vfops.training._config import GRPOConfig

_PARAM_BATCH = 100
RESUMES_TAG: Final = "vfops.resumes"
"""How many times the run was resumed from a checkpoint (and continued here)."""
RESUMED_FROM_TAG: Final = "vfops.resumed_from_run"
"""On a new run of a resumed training whose own run is not in this store: that run's id."""
log = logging.getLogger("vfops.training")


class TrainingTracker:
    """One MLflow run per training run; see the module docstring."""

    def __init__(self, client: MlflowClient, run_id: str) -> None:
        self._client = client
        self.run_id = run_id

    @classmethod
    def start(
        cls,
        config: GRPOConfig,
        *,
        base_model: str,
        env_versions: dict[str, str],
        resolved: dict[str, str] | None = None,
        continue_run: str | None = None,
    ) -> TrainingTracker:
        """A new MLflow run with the config as params (``config.*``) and what the set-up
        chose for its ``auto`` values as ``resolved.*`` (e.g. the attention kernels).

        ``continue_run``: the run a resumed checkpoint was trained in; it is reopened
        (``RUNNING`` again, its steps continue) instead, with any config value that
        changed since (e.g. ``run.steps``) as a param ``resumeN.<name>`` (params are
        immutable). A run not in this store gets a new run, tagged with the old id."""
        params: dict[str, str] = {}
        # Secret-looking names (api keys, tokens, passwords) are dropped by _flatten.
        _flatten("config", config.model_dump(), params)
        params.update({f"resolved.{k}": v for k, v in (resolved or {}).items()})
        client = mlflow_client()
        if continue_run is not None:
            run = _existing_run(client, continue_run)
            if run is not None:
                _reopen(client, run, params)
                return cls(client, run.info.run_id)
            log.warning(
                "the checkpoint's MLflow run %s is not in this tracking store; "
                "logging the resumed training to a new run",
                continue_run,
            )
        experiment_id = ensure_experiment(client, config.run.experiment)
        tags = {
            "vfops.kind": "training",
            "vfops.base_model": base_model,
            "vfops.environment": config.environment.id,
            "vfops.environment_versions": ",".join(
                f"{k}@{v}" for k, v in sorted(env_versions.items())
            ),
            "vfops.loss": config.loss.type,
            "vfops.generation_backend": config.generation.backend,
            **prefect_run_tags(),  # started from a flow run: a link back to it
        }
        if continue_run is not None:
            tags[RESUMED_FROM_TAG] = continue_run
        run = client.create_run(
            experiment_id, run_name=f"grpo-{config.environment.id}-{base_model}", tags=tags
        )
        _log_params(client, run.info.run_id, params)
        return cls(client, run.info.run_id)

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        """All of a step's metrics in one ``log_batch`` call."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in sorted(metrics.items())]
        self._client.log_batch(self.run_id, metrics=batch)

    def set_tag(self, key: str, value: str) -> None:
        self._client.set_tag(self.run_id, key, value)

    def log_artifact(self, path: Path, folder: str) -> None:
        """``path`` as an artifact of the run, under ``folder``."""
        self._client.log_artifact(self.run_id, str(path), folder)

    def finish(self, status: str = "FINISHED") -> None:
        self._client.set_terminated(self.run_id, status=status)

    def history(self, key: str) -> list[tuple[int, float]]:
        """``(step, value)`` of a metric (for tests and reports)."""
        return [(m.step, m.value) for m in self._client.get_metric_history(self.run_id, key)]


def _existing_run(client: MlflowClient, run_id: str) -> Any | None:
    """The run ``run_id`` when this store has it (and it is not deleted)."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException:
        return None
    return run if run.info.lifecycle_stage != "deleted" else None


def _reopen(client: MlflowClient, run: Any, params: dict[str, str]) -> None:
    """Continue ``run``: ``RUNNING`` again, counted in :data:`RESUMES_TAG`; a param this
    resume's config adds is logged, one whose value changed is logged as
    ``resume<N>.<name>`` beside the original."""
    resumes = int(run.data.tags.get(RESUMES_TAG, "0")) + 1
    logged = run.data.params
    new = {k: v for k, v in params.items() if k not in logged}
    new.update({f"resume{resumes}.{k}": v for k, v in params.items() if logged.get(k, v) != v})
    client.update_run(run.info.run_id, status="RUNNING")
    client.set_tag(run.info.run_id, RESUMES_TAG, str(resumes))
    _log_params(client, run.info.run_id, new)


def _log_params(client: MlflowClient, run_id: str, params: dict[str, str]) -> None:
    from mlflow.entities import Param

    items = [Param(k, v) for k, v in sorted(params.items())]
    for i in range(0, len(items), _PARAM_BATCH):
        client.log_batch(run_id, params=items[i : i + _PARAM_BATCH])
