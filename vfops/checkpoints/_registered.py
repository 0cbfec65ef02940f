"""Hugging Face checkpoints as MLflow model versions, and back to a local directory.

The model directory is copied as-is (weights, tokenizer, config, generation
config) into the artifacts of an MLflow run, and a version of the registered
model is created from that artifact path. No MLflow flavour is involved: what
is registered is exactly what ``from_pretrained`` loads.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfops._errors import VfopsError
from vfops._settings import vfops_home
from vfops.tracking import LOGGED_MODEL_TAG, ensure_experiment, mlflow_client, tracking_uri

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

CHECKPOINT_EXPERIMENT = "vfops-checkpoints"
"""The MLflow experiment of the runs that register checkpoints."""

ARTIFACT_PATH = "model"
"""Where the model directory lies inside the registering run's artifacts."""

TAG_TRAINING_RUN = "vfops.training_run_id"
TAG_BASE_MODEL = "vfops.base_model"
TAG_ENV_VERSIONS = "vfops.environment_versions"
TAG_SOURCE = "vfops.source_dir"
TAG_FILES = "vfops.files"
TAG_LOGGED_MODEL = LOGGED_MODEL_TAG
"""The MLflow logged model standing for the version (an eval run's model input)."""

_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
_URI_RE = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))/?$")


@dataclass(frozen=True)
class ModelVersionInfo:
    """One version of a registered model."""

    name: str
    version: str
    run_id: str | None
    source: str
    tags: dict[str, str] = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)

    @property
    def uri(self) -> str:
        return f"models:/{self.name}/{self.version}"

    @classmethod
    def from_mlflow(cls, mv: ModelVersion) -> ModelVersionInfo:
        return cls(
            name=str(mv.name),
            version=str(mv.version),
            run_id=mv.run_id or None,
            source=str(mv.source),
            tags={str(k): str(v) for k, v in (mv.tags or {}).items()},
            aliases=[str(a) for a in (mv.aliases or [])],
        )


def _check_model_dir(path: Path) -> list[str]:
    if not path.is_dir():
        raise VfopsError(f"{str(path)!r} is not a directory; pass a Hugging Face model folder")
    if not (path / "config.json").is_file():
        raise VfopsError(
            f"{path} has no config.json; pass a folder written by save_pretrained "
            "(config, weights, tokenizer)"
        )
    if not any(any(path.glob(pattern)) for pattern in _WEIGHT_PATTERNS):
        raise VfopsError(f"{path} holds no weights (*.safetensors or *.bin); save the model first")
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def _ensure_registered_model(client: MlflowClient, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        try:
            client.create_registered_model(name)
        except MlflowException:
            client.get_registered_model(name)  # created concurrently; else raise


def register_checkpoint(
    path: str | Path,
    *,
    name: str,
    training_run_id: str | None = None,
    base_model: str | None = None,
    environment_versions: Mapping[str, str] | list[str] | None = None,
    description: str | None = None,
) -> ModelVersionInfo:
    """Log the Hugging Face model folder ``path`` as a new version of registered model ``name``.

    ``environment_versions``: the environments (``{"name": "1.2.0"}`` or
    ``["name@1.2.0"]``) the checkpoint was trained on. The folder goes to the
    configured MLflow artifact store (the experiment's artifact location: local
    for the embedded store, whatever the server uses, e.g. S3, otherwise).
    """
    source_dir = Path(path).expanduser().resolve()
    files = _check_model_dir(source_dir)
    if not name or "/" in name or "@" in name:
        raise VfopsError(f"invalid model name {name!r}: no '/' or '@', not empty")
    envs: dict[str, str]
    if environment_versions is None:
        envs = {}
    elif isinstance(environment_versions, Mapping):
        envs = {str(k): str(v) for k, v in environment_versions.items()}
    else:
        envs = {}
        for item in environment_versions:
            env_name, _, version = str(item).partition("@")
            envs[env_name] = version
    tags: dict[str, str] = {TAG_SOURCE: str(source_dir), TAG_FILES: str(len(files))}
    if training_run_id:
        tags[TAG_TRAINING_RUN] = training_run_id
    if base_model:
        tags[TAG_BASE_MODEL] = base_model
    if envs:
        tags[TAG_ENV_VERSIONS] = json.dumps(envs, sort_keys=True)

    client = mlflow_client()
    experiment_id = ensure_experiment(client, CHECKPOINT_EXPERIMENT)
    run = client.create_run(
        experiment_id,
        run_name=f"register-{name}",
        tags={**tags, "vfops.kind": "checkpoint", "vfops.registered_model": name},
    )
    run_id = run.info.run_id
    try:
        client.log_artifacts(run_id, str(source_dir), artifact_path=ARTIFACT_PATH)
        info = _read_json(source_dir / "config.json")
        for key in ("model_type", "architectures", "vocab_size", "num_hidden_layers"):
            if key in info:
                client.log_param(run_id, key, json.dumps(info[key]))
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id, status="FINISHED")
    _ensure_registered_model(client, name)
    # MLflow 3's model entity: what an eval run of this version takes as its model input
    # (the UI's link); the weights stay the registering run's artifacts (``source``)
    logged = _logged_model(client, experiment_id, name, run_id)
    tags[TAG_LOGGED_MODEL] = logged
    source = f"{run.info.artifact_uri.rstrip('/')}/{ARTIFACT_PATH}"
    mv = client.create_model_version(
        name, source, run_id=run_id, tags=tags, description=description
    )
    client.set_logged_model_tags(
        logged, {"mlflow.modelVersions": json.dumps([{"name": name, "version": int(mv.version)}])}
    )
    return ModelVersionInfo.from_mlflow(mv)


def _logged_model(client: MlflowClient, experiment_id: str, name: str, run_id: str) -> str:
    """A READY logged model standing for the version about to be registered; its id."""
    from mlflow.entities import LoggedModelStatus

    model = client.create_logged_model(experiment_id, name=name, source_run_id=run_id)
    client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    return str(model.model_id)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/NAME@alias`` or ``models:/NAME/VERSION`` -> (name, alias, version)."""
    match = _URI_RE.match(uri.strip())
    if match is None:
        raise VfopsError(
            f"invalid model URI {uri!r}; use models:/NAME@ALIAS or models:/NAME/VERSION"
        )
    return match["name"], match["alias"], match["version"]


def resolve_version(uri: str, client: MlflowClient | None = None) -> ModelVersionInfo:
    """The model version ``uri`` points at (an alias is resolved now)."""
    from mlflow.exceptions import MlflowException

    name, alias, version = parse_model_uri(uri)
    client = client or mlflow_client()
    try:
        if alias is not None:
            mv = client.get_model_version_by_alias(name, alias)
        else:
            mv = client.get_model_version(name, str(version))
    except MlflowException as exc:
        raise VfopsError(
            f"{uri} does not exist in the MLflow registry ({exc.error_code}); "
            "register it with: vfops model register PATH --name NAME"
        ) from exc
    return ModelVersionInfo.from_mlflow(mv)


@contextlib.contextmanager
def _no_progress_bar() -> Iterator[None]:
    """MLflow's per-file download bars, off unless the user turned them on: a gate or
    an eval prints its own lines, and the bars land between them (or in a log file)."""
    name = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    if name in os.environ:
        yield
        return
    os.environ[name] = "false"
    try:
        yield
    finally:
        os.environ.pop(name, None)


def load_model_dir(uri: str | ModelVersionInfo, dst: str | Path | None = None) -> Path:
    """Download model version ``uri`` to a local folder and return it.

    Versions are immutable, so the default destination
    ``$VFOPS_HOME/models/NAME/VERSION`` is a cache: a complete earlier download is
    reused. The folder loads with :class:`vfops.local.LocalModelClient`.
    """
    import mlflow.artifacts

    client = mlflow_client()
    # an already resolved version is immutable: no second registry lookup
    mv = uri if isinstance(uri, ModelVersionInfo) else resolve_version(uri, client)
    target = Path(dst) if dst is not None else vfops_home() / "models" / mv.name / mv.version
    marker = target / ".vfops-complete"
    if marker.is_file():
        return target
    source = client.get_model_version_download_uri(mv.name, mv.version)
    target.parent.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp,
        _no_progress_bar(),
    ):
        local = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=source, dst_path=tmp, tracking_uri=tracking_uri()
            )
        )
        if not (local / "config.json").is_file():
            raise VfopsError(f"{uri} (source {source}) holds no config.json; not a model folder")
        if target.exists():
            shutil.rmtree(target)
        local.rename(target)
    marker.write_text(json.dumps({"uri": mv.uri, "source": source}) + "\n")
    return target
