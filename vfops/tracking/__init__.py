"""MLflow tracking of eval runs: one MLflow run per registry run, experiment per environment.

With nothing configured, MLflow uses an embedded SQLite store under ``$VFOPS_HOME/mlflow``
(artifacts in ``$VFOPS_HOME/mlflow/artifacts``); ``MLFLOW_TRACKING_URI`` points at a
server (whose ``--artifacts-destination`` may be S3), and ``VFOPS_MLFLOW_ARTIFACTS``
(``s3://bucket/prefix``, with MLflow's ``MLFLOW_S3_ENDPOINT_URL`` for MinIO) moves the
artifacts of new experiments of a store without a server. ``VFOPS_TRACKING=0`` turns
tracking off. MLflow is imported only when a function here is called.
"""

from __future__ import annotations

from vfops.tracking._mlflow import (
    EMBEDDED_DIR,
    RUN_ID_TAG,
    SWEEP_TAG,
    artifact_root,
    check_tracking,
    experiment_name,
    finish_sweep_runs,
    is_embedded,
    log_eval_run,
    mlflow_client,
    prepare_experiment,
    start_sweep_runs,
    tracking_enabled,
    tracking_uri,
)
from vfops.tracking._tracker import Tracker

__all__ = [
    "EMBEDDED_DIR",
    "RUN_ID_TAG",
    "SWEEP_TAG",
    "Tracker",
    "artifact_root",
    "check_tracking",
    "experiment_name",
    "finish_sweep_runs",
    "is_embedded",
    "log_eval_run",
    "mlflow_client",
    "prepare_experiment",
    "start_sweep_runs",
    "tracking_enabled",
    "tracking_uri",
]
