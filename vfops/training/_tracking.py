"""Training runs in MLflow: params from the config, per-step metrics with ``log_batch``.

Uses the same store as checkpoints (``vfops.tracking``: ``MLFLOW_TRACKING_URI``
or the embedded SQLite store under VFOPS_HOME). mlflow is imported inside functions.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from vfops.tracking import ensure_experiment, mlflow_client, prefect_run_tags
from vfops.tracking import flatten_params as _flatten

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from vfops.training._config import GRPOConfig

_PARAM_BATCH = 100


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
    ) -> TrainingTracker:
        """A new MLflow run with the config as params (``config.*``) and what the set-up
        chose for its ``auto`` values as ``resolved.*`` (e.g. the attention kernels)."""
        from mlflow.entities import Param

        client = mlflow_client()
        experiment_id = ensure_experiment(client, config.run.experiment)
        run = client.create_run(
            experiment_id,
            run_name=f"grpo-{config.environment.id}-{base_model}",
            tags={
                "vfops.kind": "training",
                "vfops.base_model": base_model,
                "vfops.environment": config.environment.id,
                "vfops.environment_versions": ",".join(
                    f"{k}@{v}" for k, v in sorted(env_versions.items())
                ),
                "vfops.loss": config.loss.type,
                "vfops.generation_backend": config.generation.backend,
                **prefect_run_tags(),  # started from a flow run: a link back to it
            },
        )
        params: dict[str, str] = {}
        # Secret-looking names (api keys, tokens, passwords) are dropped by _flatten.
        _flatten("config", config.model_dump(), params)
        params.update({f"resolved.{k}": v for k, v in (resolved or {}).items()})
        items = [Param(k, v) for k, v in sorted(params.items())]
        for i in range(0, len(items), _PARAM_BATCH):
            client.log_batch(run.info.run_id, params=items[i : i + _PARAM_BATCH])
        return cls(client, run.info.run_id)

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        """All of a step's metrics in one ``log_batch`` call."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in sorted(metrics.items())]
        self._client.log_batch(self.run_id, metrics=batch)

    def set_tag(self, key: str, value: str) -> None:
        self._client.set_tag(self.run_id, key, value)

    def finish(self, status: str = "FINISHED") -> None:
        self._client.set_terminated(self.run_id, status=status)

    def history(self, key: str) -> list[tuple[int, float]]:
        """``(step, value)`` of a metric (for tests and reports)."""
        return [(m.step, m.value) for m in self._client.get_metric_history(self.run_id, key)]
