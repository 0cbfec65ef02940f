"""MLflow for all of vfops: the store, its client, and eval runs as MLflow runs.

One store serves eval runs (one MLflow run per registry run, experiment per
environment), training runs and model checkpoints (the model registry). With nothing
configured it is an embedded SQLite store under ``$VFOPS_HOME/mlflow`` (artifacts in
``$VFOPS_HOME/mlflow/artifacts``); ``MLFLOW_TRACKING_URI`` points at a server (whose
``--artifacts-destination`` may be S3), and ``VFOPS_MLFLOW_ARTIFACTS``
(``s3://bucket/prefix``, with MLflow's ``MLFLOW_S3_ENDPOINT_URL`` for MinIO) moves the
artifacts of new experiments of a store without a server. ``VFOPS_TRACKING=0`` turns
eval tracking off. MLflow is imported only when a function here is called.
"""

from __future__ import annotations

from vfops.tracking._client import (
    EMBEDDED_DIR,
    artifact_root,
    check_sqlite_store,
    check_tracking,
    ensure_experiment,
    is_embedded,
    mlflow_client,
    tracking_uri,
)
from vfops.tracking._eval_runs import (
    RUN_ID_TAG,
    SWEEP_TAG,
    experiment_name,
    finish_mlflow_run,
    finish_sweep_runs,
    log_eval_run,
    log_progress,
    log_run_info,
    open_mlflow_run,
    prepare_experiment,
    start_sweep_runs,
    tracking_enabled,
)
from vfops.tracking._inputs import LOGGED_MODEL_TAG, MODEL_VERSION_TAG
from vfops.tracking._lifeline import RunTakenOver, wait_for_tracker
from vfops.tracking._links import (
    PREFECT_FLOW_RUN_ID_TAG,
    PREFECT_FLOW_RUN_URL_TAG,
    mlflow_run_link,
    mlflow_run_url,
    prefect_flow_run,
    prefect_run_tags,
)
from vfops.tracking._params import flatten_params
from vfops.tracking._run_info import link_mlflow_run, prepare_run_log, run_info_json
from vfops.tracking._tracker import ExportError, SideChannel, Tracker

__all__ = [
    "EMBEDDED_DIR",
    "LOGGED_MODEL_TAG",
    "MODEL_VERSION_TAG",
    "PREFECT_FLOW_RUN_ID_TAG",
    "PREFECT_FLOW_RUN_URL_TAG",
    "RUN_ID_TAG",
    "SWEEP_TAG",
    "ExportError",
    "RunTakenOver",
    "SideChannel",
    "Tracker",
    "artifact_root",
    "check_sqlite_store",
    "check_tracking",
    "ensure_experiment",
    "experiment_name",
    "finish_mlflow_run",
    "finish_sweep_runs",
    "flatten_params",
    "is_embedded",
    "link_mlflow_run",
    "log_eval_run",
    "log_progress",
    "log_run_info",
    "mlflow_client",
    "mlflow_run_link",
    "mlflow_run_url",
    "open_mlflow_run",
    "prefect_flow_run",
    "prefect_run_tags",
    "prepare_experiment",
    "prepare_run_log",
    "run_info_json",
    "start_sweep_runs",
    "tracking_enabled",
    "tracking_uri",
    "wait_for_tracker",
]
