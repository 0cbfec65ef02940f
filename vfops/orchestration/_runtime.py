"""The Prefect flow run the current code runs in, for the links other records keep.

MLflow runs, registry runs and reports name the flow run that made them; they ask here,
so that only this package talks to Prefect's runtime. Prefect is only asked when it is
already imported: a flow run always imported it, and code outside one must not pay for it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun


def current_flow_run() -> tuple[str, str | None] | None:
    """The Prefect flow run this code runs in: its id and UI address (``None`` when
    Prefect's UI address is not configured), or ``None`` outside a flow run."""
    if "prefect" not in sys.modules:
        return None
    from prefect.runtime import flow_run
    from prefect.settings import PREFECT_UI_URL

    flow_run_id = flow_run.get_id()
    if not flow_run_id:
        return None
    try:
        base = PREFECT_UI_URL.value()
    except Exception:  # an address is a convenience, never a reason to fail a run
        base = None
    if not base or not str(base).startswith(("http://", "https://")):
        return str(flow_run_id), None
    return str(flow_run_id), f"{str(base).rstrip('/')}/flow-runs/flow-run/{flow_run_id}"


def flow_run_link(flow_run: FlowRun) -> str:
    """A flow run's UI address, or its id when no UI address is configured."""
    from prefect.utilities.urls import url_for

    try:
        url = url_for(flow_run)
    except Exception:  # an address is a convenience, never a reason to fail a run
        url = None
    return url or str(flow_run.id)
