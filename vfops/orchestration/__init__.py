"""Prefect's one home in vfops: deployments, work pools, automations, global concurrency
limits, the request limiter over them, cron checks and the current flow run.

Everything else in vfops is Prefect-free and reaches Prefect through here; the flow
definitions (``vfops.flows``, on the top layer) are thin and found by their ``vfops.flows``
entry points, never imported by name. This package sits low (it imports only the core,
``registry``-level packages and ``budget``), so the CLI, the demo, the stack and the flows
all use it.

Importing it imports neither Prefect nor pydantic: the exports load on first use, and
each module imports Prefect inside the functions that need it.
"""

from typing import TYPE_CHECKING

from vfops._lazy import lazy_exports

if TYPE_CHECKING:
    from vfops.orchestration._automations import (
        DEFAULT_HEARTBEAT_TIMEOUT_S,
        RESCHEDULE_AUTOMATION,
        ZOMBIE_AUTOMATION,
        cell_automations,
        ensure_automations,
    )
    from vfops.orchestration._deployments import (
        DEFAULT_NIGHTLY_CRON,
        DEFAULT_WORK_POOL,
        DeploymentSpec,
        DeployOptions,
        NightlyDeployment,
        check_api,
        configured_api_url,
        deploy_all,
        deployment_specs,
    )
    from vfops.orchestration._fanout import (
        DEFAULT_CRASHED_GRACE_S,
        DEFAULT_POLL_S,
        FanOut,
        fan_out,
    )
    from vfops.orchestration._flows import (
        FLOW_GROUP,
        FlowRef,
        flow_entry_points,
        flow_ref,
        load_flow,
    )
    from vfops.orchestration._limiter import (
        DEFAULT_ACQUIRE_TIMEOUT_S,
        DEFAULT_LEASE_DURATION_S,
        PrefectRequestLimiter,
        prefect_limiter,
    )
    from vfops.orchestration._limits import (
        GPU_LEASE_S,
        LimitsInfo,
        ensure_limit,
        ensure_limits,
        gpu_slots,
        read_rate_limit,
    )
    from vfops.orchestration._pools import (
        IMAGE_POOL_TYPES,
        POOL_TYPES,
        PoolType,
        default_job_template,
        engine_command,
        ensure_work_pool,
        heartbeat_after,
        pool_workers,
        prefect_client,
        process_job_template,
        put_work_pool,
    )
    from vfops.orchestration._runtime import current_flow_run, flow_run_link
    from vfops.orchestration._sandbox_gate import (
        DEFAULT_FLEET_CONTAINERS,
        SANDBOX_LIMIT,
        PrefectFleetGate,
    )
    from vfops.orchestration._schedules import check_cron

_MODULES: dict[str, tuple[str, ...]] = {
    "_automations": (
        "DEFAULT_HEARTBEAT_TIMEOUT_S",
        "RESCHEDULE_AUTOMATION",
        "ZOMBIE_AUTOMATION",
        "cell_automations",
        "ensure_automations",
    ),
    "_deployments": (
        "DEFAULT_NIGHTLY_CRON",
        "DEFAULT_WORK_POOL",
        "DeployOptions",
        "DeploymentSpec",
        "NightlyDeployment",
        "check_api",
        "configured_api_url",
        "deploy_all",
        "deployment_specs",
    ),
    "_fanout": ("DEFAULT_CRASHED_GRACE_S", "DEFAULT_POLL_S", "FanOut", "fan_out"),
    "_flows": ("FLOW_GROUP", "FlowRef", "flow_entry_points", "flow_ref", "load_flow"),
    "_limiter": (
        "DEFAULT_ACQUIRE_TIMEOUT_S",
        "DEFAULT_LEASE_DURATION_S",
        "PrefectRequestLimiter",
        "prefect_limiter",
    ),
    "_limits": (
        "GPU_LEASE_S",
        "LimitsInfo",
        "ensure_limit",
        "ensure_limits",
        "gpu_slots",
        "read_rate_limit",
    ),
    "_sandbox_gate": ("DEFAULT_FLEET_CONTAINERS", "SANDBOX_LIMIT", "PrefectFleetGate"),
    "_pools": (
        "IMAGE_POOL_TYPES",
        "POOL_TYPES",
        "PoolType",
        "default_job_template",
        "engine_command",
        "ensure_work_pool",
        "heartbeat_after",
        "pool_workers",
        "prefect_client",
        "process_job_template",
        "put_work_pool",
    ),
    "_runtime": ("current_flow_run", "flow_run_link"),
    "_schedules": ("check_cron",),
}

__all__ = [
    "DEFAULT_ACQUIRE_TIMEOUT_S",
    "DEFAULT_CRASHED_GRACE_S",
    "DEFAULT_FLEET_CONTAINERS",
    "DEFAULT_HEARTBEAT_TIMEOUT_S",
    "DEFAULT_LEASE_DURATION_S",
    "DEFAULT_NIGHTLY_CRON",
    "DEFAULT_POLL_S",
    "DEFAULT_WORK_POOL",
    "FLOW_GROUP",
    "GPU_LEASE_S",
    "IMAGE_POOL_TYPES",
    "POOL_TYPES",
    "RESCHEDULE_AUTOMATION",
    "SANDBOX_LIMIT",
    "ZOMBIE_AUTOMATION",
    "DeployOptions",
    "DeploymentSpec",
    "FanOut",
    "FlowRef",
    "LimitsInfo",
    "NightlyDeployment",
    "PoolType",
    "PrefectFleetGate",
    "PrefectRequestLimiter",
    "cell_automations",
    "check_api",
    "check_cron",
    "configured_api_url",
    "current_flow_run",
    "default_job_template",
    "deploy_all",
    "deployment_specs",
    "engine_command",
    "ensure_automations",
    "ensure_limit",
    "ensure_limits",
    "ensure_work_pool",
    "fan_out",
    "flow_entry_points",
    "flow_ref",
    "flow_run_link",
    "gpu_slots",
    "heartbeat_after",
    "load_flow",
    "pool_workers",
    "prefect_client",
    "prefect_limiter",
    "process_job_template",
    "put_work_pool",
    "read_rate_limit",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {name: f"{__name__}.{module}" for module, names in _MODULES.items() for name in names},
    __all__,
)
