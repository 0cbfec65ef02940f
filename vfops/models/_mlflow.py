"""Where MLflow lives: ``MLFLOW_TRACKING_URI``, or an embedded SQLite store under VFOPS_HOME.

mlflow itself is imported only inside functions (it is heavy).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from vfops._errors import MissingExtraError
from vfops._settings import vfops_home

if TYPE_CHECKING:
    from mlflow import MlflowClient

CHECKPOINT_EXPERIMENT = "vfops-checkpoints"


def mlflow_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI``, else ``sqlite:///$VFOPS_HOME/mlflow/mlflow.db``."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{embedded_dir() / 'mlflow.db'}"


def embedded_dir() -> Path:
    path = vfops_home() / "mlflow"
    path.mkdir(parents=True, exist_ok=True)
    return path


def is_embedded(uri: str) -> bool:
    return not uri.startswith(("http://", "https://", "databricks"))


def default_artifact_location(uri: str) -> str | None:
    """Artifact root for experiments vfops creates.

    A tracking server decides for itself (its ``--default-artifact-root`` or
    artifact proxy, e.g. S3); an embedded store keeps them under
    ``$VFOPS_HOME/mlflow/artifacts`` instead of MLflow's ``./mlruns`` of the cwd.
    """
    if not is_embedded(uri):
        return None
    return (embedded_dir() / "artifacts").as_uri()


def mlflow_client() -> MlflowClient:
    try:
        from mlflow import MlflowClient
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError("mlflow", exc.name or "mlflow") from exc
    uri = mlflow_tracking_uri()
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def ensure_experiment(client: MlflowClient, name: str) -> str:
    """The id of experiment ``name``, created (with vfops' artifact location) if missing."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    uri = mlflow_tracking_uri()
    try:
        return str(client.create_experiment(name, artifact_location=default_artifact_location(uri)))
    except Exception:
        # a concurrent creator won the race
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return str(found.experiment_id)
