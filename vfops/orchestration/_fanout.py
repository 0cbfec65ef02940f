"""Fan-out over a deployment: one flow run per item, at most N at once, on any worker.

A distributed sweep submits each cell as its own flow run of the cell deployment and
waits for them all; which worker takes a run is the pool's business. A run that reads
Crashed (its worker was lost) is not final here for ``crashed_grace_s``: the reschedule
automation (:mod:`vfops.orchestration._automations`) puts it back to Scheduled and
another worker resumes it. Synchronous: it is called from a sync flow, inside its run
(each submission is a subflow of it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

DEFAULT_CRASHED_GRACE_S = 180.0
"""How long a Crashed run is waited on before it counts as final: the reschedule
automation moves a crashed run back to Scheduled within seconds."""
DEFAULT_POLL_S = 2.0


@dataclass(frozen=True)
class FanOut:
    """How to fan out: the deployment, the idempotency key, how many runs at once."""

    deployment: str
    """``flow-name/deployment-name``."""
    key: str
    """Prefix of each submission's idempotency key (with its index): within one key a
    repeated submission returns the same flow run."""
    parallel: int
    crashed_grace_s: float = DEFAULT_CRASHED_GRACE_S
    poll_s: float = DEFAULT_POLL_S


def fan_out(
    plan: FanOut,
    runs: Sequence[tuple[str, dict[str, Any]]],
    *,
    submitted: Callable[[int, FlowRun], None] | None = None,
) -> Iterator[tuple[int, FlowRun]]:
    """Submit ``runs`` (``(flow run name, parameters)`` each) at most ``plan.parallel`` at
    a time; yield ``(index, flow run)`` as each reaches a final state. ``submitted`` is
    told of each flow run as it is submitted."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.deployments import run_deployment

    running: dict[UUID, int] = {}
    crashed_since: dict[UUID, float] = {}
    queue = list(enumerate(runs))
    with get_client(sync_client=True) as client:
        while queue or running:
            while queue and len(running) < plan.parallel:
                index, (name, parameters) = queue.pop(0)
                # called from a sync flow: the sync variant, which returns the flow run
                flow_run = cast(
                    "FlowRun",  # imported for type checking only
                    run_deployment(
                        plan.deployment,
                        parameters=parameters,
                        flow_run_name=name,
                        timeout=0,  # submit; this loop waits for every run at once
                        idempotency_key=f"{plan.key}:{index}",
                        as_subflow=True,
                    ),
                )
                if submitted is not None:
                    submitted(index, flow_run)
                running[flow_run.id] = index
            time.sleep(plan.poll_s)
            found = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(running)))
            )
            for run in found:
                state = run.state
                if state is None or run.id not in running:
                    continue
                if state.is_crashed():
                    first = crashed_since.setdefault(run.id, time.monotonic())
                    if time.monotonic() - first < plan.crashed_grace_s:
                        continue  # the reschedule automation may still take it back
                else:
                    crashed_since.pop(run.id, None)
                if not state.is_final():
                    continue
                yield running.pop(run.id), run
