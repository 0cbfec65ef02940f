"""Export a registry run as a ``datasets`` dataset and parquet, to a folder or S3."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from vfops._errors import VfopsError
from vfops._paths import check_writable_folder
from vfops._rollout import rollout_features
from vfops.envs import quiet_datasets

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

_TO_FIX = "pass a writable folder (or s3://bucket/prefix) to --to"


def run_metadata(engine: Engine, run_id: str) -> dict[str, Any]:
    from vfops.registry import get_run, session_scope

    with session_scope(engine, write=False) as session:
        run = get_run(session, run_id)
        if run is None:
            raise VfopsError(f"no eval run {run_id!r} in the registry; see: vfops runs list")
        return {
            "run_id": run.id,
            "env_name": run.environment_name,
            "env_version": run.environment_version,
            "env_code_hash": run.environment_content_hash,
            "model": run.model,
            "sampling_args": run.sampling_args,
            "env_args": run.env_args,
            "num_examples": run.num_examples,
            "rollouts_per_example": run.rollouts_per_example,
            "status": run.status,
            "started_at": run.started_at.isoformat(),
            "finished_at": run.finished_at.isoformat() if run.finished_at else None,
            "summary": run.summary,
            "vfops_version": run.vfops_version,
            "mlflow_run_id": run.mlflow_run_id,
            "output_dir": run.output_dir,
            "base_url": run.base_url,
            "tags": list(run.tags or []),
        }


def export_run(engine: Engine, run_id: str, destination: str) -> str:
    """Write ``dataset/`` (save_to_disk), ``rollouts.parquet`` and ``metadata.json``.

    ``destination`` is a folder or ``s3://bucket/prefix`` (uploaded with boto3).
    Rows are streamed from the registry; memory does not grow with the run.
    """
    from datasets import Dataset

    metadata = run_metadata(engine, run_id)
    full_id = metadata["run_id"]
    if not destination.startswith("s3://"):
        # before the export is built: a wrong place fails now, with nothing written
        check_writable_folder(destination, what="export folder", fix=_TO_FIX)

    with tempfile.TemporaryDirectory(prefix="vfops-export-") as tmp:
        staging = Path(tmp) / "export"
        with quiet_datasets():
            dataset = Dataset.from_generator(
                _rows,
                features=rollout_features(),
                cache_dir=str(Path(tmp) / "cache"),
                # plain strings: datasets fingerprints the generator's arguments
                gen_kwargs={
                    "database_url": engine.url.render_as_string(hide_password=False),
                    "run_id": full_id,
                },
            )
            dataset.info.description = orjson.dumps(metadata).decode()
            dataset.save_to_disk(str(staging / "dataset"))
            dataset.to_parquet(str(staging / "rollouts.parquet"))
        (staging / "metadata.json").write_bytes(orjson.dumps(metadata, option=orjson.OPT_INDENT_2))
        if destination.startswith("s3://"):
            _upload_folder(staging, destination.rstrip("/"))
            return destination
        target = Path(destination)
        try:
            _copy_folder(staging, target)
        except OSError as exc:  # the disk filled up, or the folder changed meanwhile
            raise VfopsError(
                f"could not write the export to {target} ({exc.strerror or exc}); {_TO_FIX}"
            ) from None
        return str(target)


def _copy_folder(source: Path, target: Path) -> None:
    """Each file whole or not at all (written beside its place, synced, renamed): an
    export killed midway, or run again over an older one, never leaves a torn parquet."""
    from vfops._atomic import replace_file_atomically

    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.rglob("*")):
        if path.is_file():
            replace_file_atomically(target / path.relative_to(source), source=path)


def _rows(database_url: str, run_id: str) -> Iterator[dict[str, Any]]:
    from vfops.registry import get_engine, iter_rollouts, session_scope

    with session_scope(get_engine(database_url), write=False) as session:
        for record in iter_rollouts(session, run_id):
            yield record.to_row()


def _upload_folder(folder: Path, uri: str) -> None:
    import boto3

    from vfops._settings import s3_endpoint_url

    bucket, _, prefix = uri[len("s3://") :].partition("/")
    client = boto3.client("s3", endpoint_url=s3_endpoint_url())
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            key = "/".join(filter(None, [prefix, path.relative_to(folder).as_posix()]))
            client.upload_file(str(path), bucket, key)
