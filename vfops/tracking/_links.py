"""Links between the places a run is recorded: MLflow runs, Prefect flow runs.

Every report, log line and tag that names an MLflow run or a Prefect flow run formats
it here, so they read the same everywhere: a link when the other side has a web
address (a tracking server over http(s); Prefect's ``PREFECT_UI_URL``), else the
plain id (an embedded SQLite store has no UI address to point at).
"""

from __future__ import annotations

import os
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from vfops.orchestration import current_flow_run

PREFECT_FLOW_RUN_ID_TAG: Final = "prefect.flow_run_id"
PREFECT_FLOW_RUN_URL_TAG: Final = "prefect.flow_run_url"


def mlflow_ui_base(tracking_uri: str | None = None) -> str | None:
    """The tracking server's web address (no credentials), or ``None`` for a store without
    a server. ``tracking_uri`` defaults to ``MLFLOW_TRACKING_URI``."""
    uri = tracking_uri if tracking_uri is not None else os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri.startswith(("http://", "https://")):
        return None
    parts = urlsplit(uri)
    host = parts.hostname or ""
    if ":" in host:  # IPv6
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def mlflow_run_url(mlflow_run_id: str, tracking_uri: str | None = None) -> str | None:
    """The MLflow UI page of run ``mlflow_run_id``, or ``None`` without a tracking server."""
    base = mlflow_ui_base(tracking_uri)
    return None if base is None else f"{base}/#/runs/{mlflow_run_id}"


def mlflow_run_link(
    mlflow_run_id: str, *, markdown: bool = False, tracking_uri: str | None = None
) -> str:
    """Run ``mlflow_run_id`` as a link: ``[id](url)`` in markdown, else the URL; the plain
    id (a code span in markdown) when the store has no server."""
    url = mlflow_run_url(mlflow_run_id, tracking_uri)
    if markdown:
        return f"`{mlflow_run_id}`" if url is None else f"[{mlflow_run_id}]({url})"
    return url or mlflow_run_id


def prefect_flow_run() -> tuple[str, str | None] | None:
    """The Prefect flow run this code runs in: its id and UI address (``None`` when
    Prefect's UI address is not configured), or ``None`` outside a flow run (asked of
    :func:`vfops.orchestration.current_flow_run`, Prefect's one home)."""
    return current_flow_run()


def prefect_run_tags() -> dict[str, str]:
    """MLflow tags naming the Prefect flow run this code runs in ({} outside one)."""
    found = prefect_flow_run()
    if found is None:
        return {}
    flow_run_id, url = found
    tags = {PREFECT_FLOW_RUN_ID_TAG: flow_run_id}
    if url:
        tags[PREFECT_FLOW_RUN_URL_TAG] = url
    return tags
