"""What an eval run read, as its MLflow run's inputs: the dataset and the model version.

The dataset is the environment version's published snapshot (its eval split, else its
train split, as the evaluation reads them) when the run evaluated a published version
with its default arguments: name ``ENV@VERSION/SPLIT``, digest the snapshot's sha256
(the content hash publishing computed, cut to the 36 characters MLflow stores; the
whole hash is in the profile), source its place in the artifact store (``file://`` or
``s3://``). Any other run (unpublished code, or arguments that may change the rows)
gets the digest of the rows it evaluated, read from its rollouts when it completes,
with a source naming the environment, its code and its arguments. Either is an
``mlflow.data`` dataset logged with context ``eval``.

A run of a registered model version (``models:/NAME/VERSION``, or an alias resolved
when the run opens) is tagged with it (:data:`MODEL_VERSION_TAG`) and, when the
version has an MLflow 3 logged model (vfops registers one with each checkpoint:
:data:`LOGGED_MODEL_TAG`), takes it as a model input, which is what MLflow's UI
links from the run page.

Only the tracker process calls this (MLflow is imported already there).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from vfops.tracking._run_info import RunInfo

log = logging.getLogger("vfops.tracking")

DATASET_CONTEXT: Final = "eval"
MODEL_VERSION_TAG: Final = "vfops.model_version"
"""On an eval run: the registered model version it evaluated, ``models:/NAME/VERSION``."""
MODEL_ALIAS_TAG: Final = "vfops.model_alias"
"""On an eval run whose model was named by alias: ``NAME@ALIAS`` (resolved at its start)."""
LOGGED_MODEL_TAG: Final = "vfops.logged_model_id"
"""On a model version vfops registered: the MLflow logged model that stands for it."""
_DIGEST_CHARS: Final = 36  # MLflow's limit on a dataset digest
_ROW_COLUMNS: Final = ("example_id", "task", "prompt", "answer", "info")
_MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))/?$")
_LOGGED_MODEL_SOURCE = re.compile(r"^models:/(?P<id>m-[0-9a-f]+)/?$")


def snapshot_dataset(
    env_name: str, env_version: str, datasets: dict[str, Any]
) -> dict[str, Any] | None:
    """The published snapshot an eval of ``env_name@env_version`` reads (``datasets``: the
    version's row, ``{split: {uri, sha256, rows}}``), as JSON for :class:`RunInfo`;
    None when the version has no snapshot (published before snapshots, or no rows)."""
    split = "eval" if "eval" in datasets else "train" if "train" in datasets else None
    if split is None:
        return None
    snap = datasets[split]
    if not snap.get("uri") or not snap.get("sha256"):
        return None
    return {
        "name": f"{env_name}@{env_version}/{split}",
        "sha256": str(snap["sha256"]),
        "source": str(snap["uri"]),
        "rows": snap.get("rows"),
        "split": split,
    }


def log_run_inputs(client: MlflowClient, run: Any, info: RunInfo) -> None:
    """Log the inputs known when the run opens (``run``: its MLflow run, as found or
    created): the published snapshot, the model version (input and tag)."""
    from mlflow.entities import LoggedModelInput, RunTag

    datasets = [] if info.dataset is None else [_snapshot_input(info.dataset)]
    model_ids, tags = _model_link(client, info.model)
    linked = {m.model_id for m in getattr(run.inputs, "model_inputs", None) or []}
    models = [LoggedModelInput(i) for i in model_ids if i not in linked]  # merged, not deduped
    if datasets or models:
        client.log_inputs(run.info.run_id, datasets=datasets, models=models)
    if tags:
        client.log_batch(run.info.run_id, tags=[RunTag(k, v) for k, v in tags.items()])


def log_rows_dataset(
    client: MlflowClient, mlflow_run_id: str, info: RunInfo, rollouts: Path
) -> None:
    """Log the rows a completed run evaluated (read from its rollouts file) as its dataset
    input: for a run without a published snapshot to name (:func:`snapshot_dataset`)."""
    from mlflow.data.code_dataset_source import CodeDatasetSource

    digest, rows = rows_digest(rollouts)
    source = CodeDatasetSource(
        {
            "vfops.environment": info.env_name,
            "vfops.environment_version": info.env_version,
            "vfops.environment_code_hash": info.code_hash,
            "vfops.env_args": json.dumps(info.env_args, sort_keys=True, default=str),
        }
    )
    name = f"{info.env_name}@{info.env_version}/eval"
    profile = {"sha256": digest, "rows": rows, "split": "eval"}
    client.log_inputs(mlflow_run_id, datasets=[_dataset_input(name, digest, source, profile)])


def rows_digest(rollouts: Path) -> tuple[str, int]:
    """The sha256 of the distinct rows (example id, task, prompt, answer, info) of a
    rollouts file (Arrow stream or parquet), in example order, and how many there
    are. Read batch by batch: a run's whole transcript never sits in memory."""
    per_example: dict[int, bytes] = {}
    for batch in _row_batches(rollouts):
        for row in batch.to_pylist():
            example = int(row["example_id"])
            if example not in per_example:
                encoded = orjson.dumps(row, option=orjson.OPT_SORT_KEYS, default=str)
                per_example[example] = hashlib.sha256(encoded).digest()
    whole = hashlib.sha256()
    for example in sorted(per_example):
        whole.update(per_example[example])
    return whole.hexdigest(), len(per_example)


def _row_batches(rollouts: Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if rollouts.name.endswith(".parquet"):
        yield from pq.ParquetFile(str(rollouts)).iter_batches(columns=list(_ROW_COLUMNS))
        return
    with pa.OSFile(str(rollouts), "rb") as handle:
        for batch in pa.ipc.open_stream(handle):
            yield batch.select(list(_ROW_COLUMNS))


def _snapshot_input(snapshot: dict[str, Any]) -> Any:
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    with warnings.catch_warnings():
        # "file:" and "" are both registered for local files: MLflow warns, then picks one
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(snapshot["source"])
    sha256 = str(snapshot["sha256"])
    profile = {"sha256": sha256, "rows": snapshot.get("rows"), "split": snapshot.get("split")}
    return _dataset_input(snapshot["name"], sha256, source, profile)


def _dataset_input(name: str, sha256: str, source: Any, profile: dict[str, Any]) -> Any:
    """An ``mlflow.data`` source's dataset (no data held: a name, digest and profile) as
    a run input of context ``eval``."""
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    dataset = Dataset(
        name=name,
        digest=sha256[:_DIGEST_CHARS],
        source_type=source._get_source_type(),
        source=source.to_json(),
        profile=json.dumps(profile, sort_keys=True),
    )
    return DatasetInput(dataset, tags=[InputTag(MLFLOW_DATASET_CONTEXT, DATASET_CONTEXT)])


def _model_link(client: MlflowClient, model: str) -> tuple[list[str], dict[str, str]]:
    """The logged models to take as inputs and the tags naming the model version, for a
    run of ``model`` (nothing for a model that is not a registered version)."""
    from mlflow.exceptions import MlflowException

    match = _MODEL_URI.match(model.strip())
    if match is None:
        return [], {}
    name, alias = match["name"], match["alias"]
    try:
        if alias is not None:
            version = client.get_model_version_by_alias(name, alias)
        else:
            version = client.get_model_version(name, match["version"])
    except MlflowException as exc:  # deleted since, or another registry: the run stands
        log.warning("eval run of %s: its model version is not in the registry (%s)", model, exc)
        return [], {}
    tags = {MODEL_VERSION_TAG: f"models:/{name}/{version.version}"}
    if alias is not None:
        tags[MODEL_ALIAS_TAG] = f"{name}@{alias}"
    found = _LOGGED_MODEL_SOURCE.match(str(version.source or ""))
    logged = (
        getattr(version, "model_id", None)
        or (version.tags or {}).get(LOGGED_MODEL_TAG)
        or (found["id"] if found else None)
    )
    return ([str(logged)] if logged else []), tags
