"""The automations that recover a distributed sweep's cell whose worker was lost.

Two automations come with the deployments (created or updated, never duplicated): a
cell flow run of a distributed sweep whose heartbeats stop (its worker was lost) is
marked Crashed, and a crashed cell flow run is scheduled again, for another worker to
resume (the cell flow refuses to start past its ``MAX_CELL_RUNS``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

ZOMBIE_AUTOMATION = "vfops: crash eval-sweep-cell runs without heartbeats"
RESCHEDULE_AUTOMATION = "vfops: reschedule crashed eval-sweep-cell runs"
DEFAULT_HEARTBEAT_TIMEOUT_S = 90.0
"""Seconds without a heartbeat after which a cell flow run counts as lost: three of
Prefect's 30 s minimum heartbeat interval (PREFECT_FLOWS_HEARTBEAT_FREQUENCY on the
workers must be below it)."""
_FINAL_EVENTS = frozenset(
    f"prefect.flow-run.{state}" for state in ("Completed", "Failed", "Cancelled", "Crashed")
)


def cell_automations(
    cell_deployment_id: str, *, heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
) -> list[Any]:
    """The two automations that recover a cell whose worker was lost.

    Zombie detection (Prefect's documented pattern): after a cell flow run is Running or
    heartbeats, expect its next heartbeat (or its end) within ``heartbeat_timeout_s``,
    per flow run; when none comes, mark it Crashed. Recovery: when a cell flow run is
    Crashed, schedule the same run again (forced: Crashed is terminal), so a worker of
    the pool picks it up and resumes the cell's registry run.
    """
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    cell_runs = ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"})
    of_cell_deployment = ResourceSpecification(
        {
            "prefect.resource.id": f"prefect.deployment.{cell_deployment_id}",
            "prefect.resource.role": "deployment",
        }
    )
    zombie = AutomationCore(
        name=ZOMBIE_AUTOMATION,
        description=(
            f"A flow run of eval-sweep-cell without a heartbeat for {heartbeat_timeout_s:g} s "
            "lost its worker: mark it Crashed (created by vfops deploy)."
        ),
        trigger=EventTrigger(
            match=cell_runs,
            match_related=of_cell_deployment,
            after={"prefect.flow-run.Running", "prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *_FINAL_EVENTS},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=heartbeat_timeout_s),
        ),
        actions=[
            ChangeFlowRunState(
                name=None,
                state=StateType.CRASHED,
                message=f"no heartbeat for {heartbeat_timeout_s:g} s: its worker was lost",
                force=False,
            )
        ],
    )
    reschedule = AutomationCore(
        name=RESCHEDULE_AUTOMATION,
        description=(
            "A crashed flow run of eval-sweep-cell is scheduled again, for another worker to "
            "resume its registry run (created by vfops deploy)."
        ),
        trigger=EventTrigger(
            match=cell_runs,
            match_related=of_cell_deployment,
            expect={"prefect.flow-run.Crashed"},
            posture=Posture.Reactive,
            threshold=1,
        ),
        actions=[
            ChangeFlowRunState(
                name=None,
                state=StateType.SCHEDULED,
                message="rescheduled after a crash: another worker resumes the cell",
                force=True,
            )
        ],
    )
    return [zombie, reschedule]


async def ensure_automations(automations: list[Any]) -> dict[str, str]:
    """Create each automation, or update the one of the same name (idempotent: a second
    ``vfops deploy`` leaves one of each); returns ``{name: id}``."""
    from prefect.client.orchestration import get_client

    ids: dict[str, str] = {}
    async with get_client() as client:
        for automation in automations:
            existing = await client.read_automations_by_name(automation.name)
            if not existing:
                ids[automation.name] = str(await client.create_automation(automation))
                continue
            keep, *duplicates = existing
            # the new trigger and actions; a pause someone chose stays
            update = automation.model_copy(update={"enabled": keep.enabled})
            await client.update_automation(keep.id, update)
            for duplicate in duplicates:  # left by concurrent deploys: one of each
                await client.delete_automation(duplicate.id)
            ids[automation.name] = str(keep.id)
    return ids
