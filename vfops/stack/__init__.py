"""A local stack: the services of ``infra/compose.yaml`` as processes on this machine.

``vfops stack up`` starts moto's S3 server, an MLflow tracking server (PostgreSQL +
S3 artifacts), a Prefect server (PostgreSQL) and N Prefect process workers, each
detached, on free loopback ports, with its pid and log recorded in ``<dir>/stack.json``;
databases live on the machine's PostgreSQL. ``vfops stack env`` prints the variables
that point vfops, MLflow and Prefect at it. Needs the ``[stack]`` extra.
"""

from __future__ import annotations

from vfops.stack._services import export_lines
from vfops.stack._stack import kill_worker, stack_down, stack_env, stack_status, stack_up
from vfops.stack._state import (
    ACCESS_KEY_VAR,
    DEFAULT_DIR,
    DEFAULT_NAME,
    DEFAULT_POOL,
    DEFAULT_POSTGRES_URL,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WORKER_HEARTBEAT_S,
    DEFAULT_WORKERS,
    POSTGRES_URL_VAR,
    SECRET_KEY_VAR,
    ServiceState,
    ServiceStatus,
    StackOptions,
    StackState,
    UpResult,
    load_state,
    parse_service_env_option,
)

__all__ = [
    "ACCESS_KEY_VAR",
    "DEFAULT_DIR",
    "DEFAULT_NAME",
    "DEFAULT_POOL",
    "DEFAULT_POSTGRES_URL",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_WORKERS",
    "DEFAULT_WORKER_HEARTBEAT_S",
    "POSTGRES_URL_VAR",
    "SECRET_KEY_VAR",
    "ServiceState",
    "ServiceStatus",
    "StackOptions",
    "StackState",
    "UpResult",
    "export_lines",
    "kill_worker",
    "load_state",
    "parse_service_env_option",
    "stack_down",
    "stack_env",
    "stack_status",
    "stack_up",
]
