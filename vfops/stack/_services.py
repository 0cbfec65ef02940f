"""The stack's services: how each is started (argv, environment), and when it is healthy.

Every process runs detached (a session of its own, :mod:`vfops.stack._process`); its
pid, port and log file go into the state file at once, so a stack command that dies
leaves nothing untracked. A service is healthy when it answers over HTTP (a worker: when
its pool reports it online, with a heartbeat since it started); one that exits or is
late fails in one line naming its log and the log's last error.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from vfops._errors import VfopsError
from vfops._json_http import json_request
from vfops._net import free_port
from vfops.orchestration import heartbeat_after, pool_workers
from vfops.stack._process import (
    SERVICE_VAR,
    STACK_ID_VAR,
    alive,
    reap,
    service_processes,
    spawn,
    stop,
)
from vfops.stack._state import (
    FLOW_RUN_HEARTBEAT_S,
    REGION,
    WORKER_QUERY_S,
    ServiceState,
    StackState,
    database_url,
    s3_keys,
    save_state,
)

if TYPE_CHECKING:
    from psutil import Process

# what a service must not inherit from the caller: it gets the stack's own values
_OWN_PREFIXES: Final = ("AWS_", "MLFLOW_", "PREFECT_")
_OWN_VARS: Final = frozenset({"VFOPS_DATABASE_URL", "VFOPS_ARTIFACTS", "VFOPS_S3_ENDPOINT_URL"})


# ---------------------------------------------------------------- HTTP


def _http(method: str, url: str, body: Any = None, *, timeout: float = 5.0) -> tuple[int, Any]:
    """(status, parsed JSON or None); an unreachable server raises OSError. The stack's
    services are on loopback: a proxy from the environment must not be asked for them."""
    return json_request(method, url, body, timeout_s=timeout, proxies=False)


def _answers(url: str, *, ok_only: bool) -> bool:
    try:
        status, _ = _http("GET", url, timeout=2.0)
    except OSError:
        return False
    return status == 200 or not ok_only


# ---------------------------------------------------------------- start


def _base_env(state: StackState, service: str) -> dict[str, str]:
    """The caller's environment without what the stack sets itself, plus the marker
    (the flow runs a worker starts inherit it), the S3 keys and Prefect's home."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_OWN_PREFIXES) and k not in _OWN_VARS
    }
    access, secret = s3_keys()
    env.update(
        {
            STACK_ID_VAR: state.stack_id,
            SERVICE_VAR: service,
            "AWS_ACCESS_KEY_ID": access,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
            "PREFECT_HOME": str(state.path / "prefect-home"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def client_env(state: StackState) -> dict[str, str]:
    """What a vfops client (a shell, a worker) sets to use the stack."""
    access, secret = s3_keys()
    s3 = state.url("s3")
    registry = database_url(state.postgres_url, state.databases["registry"], "psycopg")
    return {
        "VFOPS_DATABASE_URL": registry,
        "VFOPS_ARTIFACTS": f"s3://{state.buckets['artifacts']}/artifacts",
        "VFOPS_S3_ENDPOINT_URL": s3,
        "AWS_ENDPOINT_URL_S3": s3,  # boto3 and the aws CLI: S3 only, other AWS untouched
        "AWS_ACCESS_KEY_ID": access,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": REGION,
        "MLFLOW_TRACKING_URI": state.url("mlflow"),
        "MLFLOW_S3_ENDPOINT_URL": s3,
        "PREFECT_API_URL": f"{state.url('prefect')}",
    }


def export_lines(env: Mapping[str, str]) -> list[str]:
    """``export NAME=value`` lines for a POSIX shell (values quoted)."""
    return [f"export {name}={shlex.quote(value)}" for name, value in env.items()]


def _python() -> str:
    return sys.executable


def _start(
    state: StackState,
    name: str,
    kind: str,
    argv: list[str],
    env: dict[str, str],
    *,
    url: str | None = None,
    port: int | None = None,
) -> ServiceState:
    log = state.path / "logs" / f"{name}.log"
    pid, started = spawn(argv, env, log, state.path)
    service = ServiceState(name, kind, pid, started, str(log), url=url, port=port)
    state.services[name] = service
    save_state(state)  # at once: a stack command that dies now leaves nothing untracked
    return service


def start_s3(state: StackState, extra: Mapping[str, str]) -> ServiceState:
    port = free_port()
    argv = [_python(), "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    env = {**_base_env(state, "s3"), **extra}
    return _start(state, "s3", "s3", argv, env, url=f"http://127.0.0.1:{port}", port=port)


def start_mlflow(state: StackState, extra: Mapping[str, str]) -> ServiceState:
    port = free_port()
    backend = database_url(state.postgres_url, state.databases["mlflow"], "psycopg")
    argv = [
        _python(), "-m", "mlflow", "server",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--backend-store-uri", backend,
        "--serve-artifacts",
        "--artifacts-destination", f"s3://{state.buckets['mlflow']}/mlflow",
        "--workers", "1",
    ]  # fmt: skip
    env = {
        **_base_env(state, "mlflow"),
        "MLFLOW_S3_ENDPOINT_URL": state.url("s3"),
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",  # as in compose: 2 processes, not 5
        **extra,
    }
    return _start(state, "mlflow", "mlflow", argv, env, url=f"http://127.0.0.1:{port}", port=port)


def start_prefect(state: StackState, extra: Mapping[str, str]) -> ServiceState:
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    database = database_url(state.postgres_url, state.databases["prefect"], "asyncpg")
    argv = [
        _python(),
        "-m",
        "prefect",
        "server",
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    env = {
        **_base_env(state, "prefect"),
        "PREFECT_API_DATABASE_CONNECTION_URL": database,
        "PREFECT_UI_API_URL": api,
        # a worker missing 3 heartbeats is marked offline: check at the heartbeat's pace
        "PREFECT_SERVER_SERVICES_FOREMAN_LOOP_SECONDS": str(min(15, state.worker_heartbeat_s)),
        **extra,
    }
    return _start(state, "prefect", "prefect", argv, env, url=api, port=port)


def start_worker(state: StackState, extra: Mapping[str, str]) -> ServiceState:
    name = f"worker-{state.next_worker}"
    state.next_worker += 1
    argv = [
        _python(), "-m", "prefect", "worker", "start",
        "--pool", state.pool, "--name", name, "--type", "process",
    ]  # fmt: skip
    if state.worker_limit is not None:  # a machine's capacity: more runs wait for another worker
        argv += ["--limit", str(state.worker_limit)]
    env = {
        **_base_env(state, name),
        **client_env(state),
        "VFOPS_WORKER_NAME": name,  # recorded on every eval run this worker executes
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(FLOW_RUN_HEARTBEAT_S),
        "PREFECT_WORKER_HEARTBEAT_SECONDS": str(state.worker_heartbeat_s),
        "PREFECT_WORKER_QUERY_SECONDS": f"{WORKER_QUERY_S:g}",
        **extra,
    }
    return _start(state, name, "worker", argv, env)


def running_services(state: StackState) -> dict[str, bool]:
    return {name: alive(s.pid, s.started) for name, s in state.services.items()}


def stop_services(state: StackState, services: list[ServiceState], *, grace_s: float) -> int:
    """Stop the services' processes: the workers together first (they would only report
    the servers gone), then the servers together."""
    count = 0
    for phase in (
        [s for s in services if s.kind == "worker"],
        [s for s in services if s.kind != "worker"],
    ):
        processes: dict[int, Process] = {}
        for service in phase:
            for process in service_processes(
                service.pid, service.started, state.stack_id, service.name
            ):
                processes[process.pid] = process
        count += stop(processes.values(), grace_s=grace_s)
        for service in phase:
            state.services.pop(service.name, None)
    if state.path.exists():
        save_state(state)
    return count


# ---------------------------------------------------------------- health


def is_healthy(state: StackState, service: ServiceState, since: float) -> bool:
    if service.kind == "s3":  # moto answers any request (a ListBuckets here)
        return _answers(f"{service.url}/", ok_only=False)
    if service.kind == "mlflow":
        return _answers(f"{service.url}/health", ok_only=True)
    if service.kind == "prefect":
        return _answers(f"{service.url}/health", ok_only=True)
    try:
        worker = pool_workers(state.url("prefect"), state.pool).get(service.name)
    except OSError:
        return False
    return (
        worker is not None and worker.get("status") == "ONLINE" and heartbeat_after(worker, since)
    )


_EXCEPTION_LINE: Final = re.compile(r"[A-Za-z_][\w.]*(Error|Exception)\b")


def _log_clue(path: str) -> str:
    """What the end of a log says went wrong: the last exception line of a traceback
    (``sqlalchemy.exc.DBAPIError: ... does not exist``), else the last line that
    mentions an error, else the last line; quoted and cut to 200 characters."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 65536))
            lines = [
                " ".join(line.split())
                for line in handle.read().decode(errors="replace").splitlines()
            ]
    except OSError:
        return ""
    lines = [line for line in lines if line]
    if not lines:
        return ""
    label, found = "last line", lines[-1]
    errors = [line for line in lines if _EXCEPTION_LINE.match(line)]
    mentions = [line for line in lines if "error" in line.lower()]
    if errors or mentions:
        label, found = "last error", (errors or mentions)[-1]
    if len(found) > 200:
        found = found[:197] + "..."
    return f' ({label}: "{found}")'


def _failure(service: ServiceState, problem: str) -> VfopsError:
    return VfopsError(
        f"{service.name} {problem}; see its log {service.log}{_log_clue(service.log)}"
    )


def wait_healthy(
    state: StackState, services: list[ServiceState], deadline: float, since: float
) -> None:
    """Until every service answers; a service that exits or is late fails in one line."""
    pending = list(services)
    while pending:
        for service in list(pending):
            code = reap(service.pid)
            if code is not None or not alive(service.pid, service.started):
                how = f"exited (code {code})" if code is not None else "exited"
                raise _failure(service, f"{how} before it was healthy")
            if is_healthy(state, service, since):
                pending.remove(service)
        if pending and time.monotonic() > deadline:
            late = pending[0]
            raise _failure(late, "did not become healthy in time (raise --timeout if slow)")
        if pending:
            time.sleep(0.25)
