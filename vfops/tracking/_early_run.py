"""The MLflow run of a handed-off evaluation, created over HTTP before the hand-off.

``vfops eval`` hands its finished run to a tracker that logs it after the command
exits (:mod:`vfops.tracking._tracker`), so the MLflow run id would not be known when
the command prints where its run is. With a tracking server, two REST calls (a few
milliseconds; the MLflow client would cost over a second to import) create the run
first, tagged with the registry run: the tracker then finds it (by id, or by that tag
on a later ``--resume``) and logs everything into it. Anything unexpected gives
``None`` and the tracker creates the run as usual.
"""

from __future__ import annotations

import os
from typing import Any, Final

from vfops._json_http import json_request
from vfops.tracking._links import mlflow_ui_base

_TIMEOUT_S: Final = 3.0


def _auth() -> dict[str, str]:
    import base64

    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        return {"Authorization": f"Bearer {token}"}
    user, password = (
        os.environ.get("MLFLOW_TRACKING_USERNAME"),
        os.environ.get("MLFLOW_TRACKING_PASSWORD"),
    )
    if user and password:
        pair = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {pair}"}
    return {}


def _request(
    method: str, url: str, body: dict[str, Any] | None = None, params: dict[str, str] | None = None
) -> tuple[int, Any]:
    return json_request(method, url, body, params=params, headers=_auth(), timeout_s=_TIMEOUT_S)


def create_run_early(info: dict[str, Any], *, tracking_uri: str | None = None) -> str | None:
    """Create the MLflow run of ``info`` (:func:`vfops.tracking.prepare_run_log`) on the
    tracking server and return its id; ``None`` without a server or on any failure."""
    import datetime as dt

    from vfops.tracking._eval_runs import RUN_ID_TAG, experiment_name, run_name

    uri = tracking_uri if tracking_uri is not None else os.environ.get("MLFLOW_TRACKING_URI", "")
    if mlflow_ui_base(uri) is None:
        return None
    api = uri.rstrip("/") + "/api/2.0/mlflow"
    name = experiment_name(str(info["env_name"]))
    try:
        status, found = _request(
            "GET", f"{api}/experiments/get-by-name", params={"experiment_name": name}
        )
        if status == 200:
            experiment = found["experiment"]
            if experiment.get("lifecycle_stage") != "active":
                return None  # the tracker restores it
            experiment_id = str(experiment["experiment_id"])
        elif os.environ.get("VFOPS_MLFLOW_ARTIFACTS"):
            return None  # the tracker creates it with its artifact location
        else:
            status, created = _request("POST", f"{api}/experiments/create", {"name": name})
            if status != 200:
                return None
            experiment_id = str(created["experiment_id"])
        started = dt.datetime.fromisoformat(str(info["started_at"]))
        if started.tzinfo is None:
            started = started.replace(tzinfo=dt.UTC)
        status, run = _request(
            "POST",
            f"{api}/runs/create",
            {
                "experiment_id": experiment_id,
                "run_name": run_name(info),
                "start_time": int(started.timestamp() * 1000),
                "tags": [{"key": RUN_ID_TAG, "value": str(info["id"])}],
            },
        )
        if status != 200:
            return None
        return str(run["run"]["info"]["run_id"])
    except (OSError, ValueError, KeyError, TypeError):  # URLError is an OSError
        return None
