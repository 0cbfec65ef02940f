"""What is logged of a registry run: read once from the registry, as plain JSON values.

The run's row becomes a :class:`RunInfo` (no base URL, no keys), which travels as JSON
to the tracker process that logs it to MLflow (:mod:`vfops.tracking._eval_runs`); the
MLflow run id comes back here to be stored on the registry run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfops.tracking._links import prefect_run_tags
from vfops.tracking._params import flatten_params
from vfops.tracking._parquet import ARTIFACT_NAME, write_rollouts_parquet

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


@dataclass(frozen=True)
class RunInfo:
    """What is logged of a registry run (read once; no base URL, no keys)."""

    id: str
    env_name: str
    env_version: str
    code_hash: str
    published: bool
    model: str
    sampling_args: dict[str, Any]
    env_args: dict[str, Any]
    num_examples: int
    rollouts_per_example: int
    status: str
    started_at: dt.datetime
    finished_at: dt.datetime | None
    summary: dict[str, Any]
    vfops_version: str
    tags: list[Any]
    mlflow_run_id: str | None
    prefect_tags: dict[str, str] = dataclasses.field(default_factory=dict)
    """The Prefect flow run that evaluated it (read where it ran: the tracker is elsewhere)."""
    dataset: dict[str, Any] | None = None
    """The published dataset snapshot it evaluated (:func:`snapshot_dataset`); None when
    unpublished or run with environment arguments (its rows are then digested)."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values (datetimes as ISO strings), for the tracker process."""
        data = dataclasses.asdict(self)
        for key in ("started_at", "finished_at"):
            if data[key] is not None:
                data[key] = data[key].isoformat()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunInfo:
        moments = {
            key: None if data.get(key) is None else dt.datetime.fromisoformat(data[key])
            for key in ("started_at", "finished_at")
        }
        return cls(**{**data, **moments})

    def params(self) -> dict[str, str]:
        params = {
            "environment": self.env_name,
            "environment_version": self.env_version,
            "environment_code_hash": self.code_hash,
            "model": self.model,
            "num_examples": str(self.num_examples),
            "rollouts_per_example": str(self.rollouts_per_example),
        }
        flatten_params("sampling", self.sampling_args, params)
        flatten_params("env_args", self.env_args, params)
        return params


def run_info_of(record: dict[str, Any]) -> RunInfo:
    """The :class:`RunInfo` of a registry run's record (:func:`vfops.registry.run_record`),
    with the Prefect flow run of this process and the published snapshot it read."""
    from vfops.tracking._inputs import snapshot_dataset

    fields = {k: v for k, v in record.items() if k != "published_datasets"}
    datasets = record.get("published_datasets")
    dataset = (
        None
        if datasets is None
        else snapshot_dataset(record["env_name"], record["env_version"], datasets)
    )
    return RunInfo(**fields, prefect_tags=prefect_run_tags(), dataset=dataset)


def run_info_json(record: dict[str, Any]) -> dict[str, Any]:
    """What :func:`open_mlflow_run` needs of a registry run's record (JSON values, no keys)."""
    return run_info_of(record).to_json()


def read_run(engine: Engine, run_id: str) -> RunInfo:
    from vfops.registry import run_record

    return run_info_of(run_record(engine, run_id))


def prepare_run_log(
    engine: Engine, run_id: str, folder: Path, rollouts_file: str | Path | None = None
) -> tuple[dict[str, Any], Path]:
    """What :func:`log_run_info` needs of registry run ``run_id`` (JSON values, no keys)
    and its rollouts file: ``rollouts_file`` when given (the evaluation's export of the
    whole run), else a parquet streamed from the registry into ``folder``."""
    info = read_run(engine, run_id)
    if rollouts_file is not None:
        return info.to_json(), Path(rollouts_file)
    path = folder / ARTIFACT_NAME
    pass_threshold = float(info.summary.get("pass_threshold", 1.0) or 1.0)
    counted = write_rollouts_parquet(engine, info.id, path, pass_threshold).to_dict()
    # statistics from every stored rollout; timings stay the evaluation's own
    timings: dict[str, Any] = {
        k: info.summary[k] for k in ("wall_s", "rollouts_per_s") if k in info.summary
    }
    return dataclasses.replace(info, summary={**counted, **timings}).to_json(), path


def link_mlflow_run(engine: Engine, run_id: str, mlflow_run_id: str) -> None:
    """Store the MLflow run id on the registry run (the link back is the MLflow tag)."""
    from vfops.registry import session_scope, set_mlflow_run_id

    with session_scope(engine) as session:
        set_mlflow_run_id(session, run_id, mlflow_run_id)
