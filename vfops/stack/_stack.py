"""The production topology (infra/compose.yaml) as local processes, without containers.

One PostgreSQL server (the machine's own) holds three databases: the vfops registry,
Prefect's and MLflow's. moto's S3 server stands in for MinIO, on loopback, with the
stack's two buckets. MLflow's tracking server keeps runs in PostgreSQL and proxies
artifacts to S3; Prefect's server runs on PostgreSQL; the registry is migrated with
``vfops db upgrade``'s function; N Prefect process workers serve one work pool, made by
:mod:`vfops.orchestration` as ``vfops deploy`` makes its own.

These are the commands; the state file is :mod:`vfops.stack._state`, the services
:mod:`vfops.stack._services`, the databases and buckets :mod:`vfops.stack._storage`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vfops._errors import VfopsError
from vfops.orchestration import engine_command, pool_workers, process_job_template, put_work_pool
from vfops.stack._process import alive, marked_processes, stop
from vfops.stack._services import (
    client_env,
    is_healthy,
    running_services,
    start_mlflow,
    start_prefect,
    start_s3,
    start_worker,
    stop_services,
    wait_healthy,
)
from vfops.stack._state import (
    CORE_KINDS,
    DEFAULT_DIR,
    DEFAULT_NAME,
    SERVICE_KINDS,
    STATE_FILE,
    STOP_GRACE_S,
    ServiceState,
    ServiceStatus,
    StackOptions,
    StackState,
    UpResult,
    admin_url,
    check_name,
    load_state,
    locked,
    save_state,
    worker_index,
)
from vfops.stack._storage import (
    create_buckets,
    create_databases,
    drop_databases,
    upgrade_registry,
)


def create_pool(state: StackState) -> None:
    """The workers' process pool on the stack's Prefect, its flow runs started as the
    stack's launcher says: created, or (kept databases) its template set again, so that
    the command names this stack's interpreter."""
    command = engine_command(sys.executable) if state.flow_run_launcher == "engine" else None
    try:
        asyncio.run(
            put_work_pool(
                state.pool, "process", process_job_template(command), api_url=state.url("prefect")
            )
        )
    except VfopsError:
        raise
    except Exception as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise VfopsError(
            f"Prefect refused to create work pool {state.pool!r} ({reason}); "
            f"see {state.services['prefect'].log}"
        ) from None


def _new_state(directory: Path, name: str, admin: str, pool: str, heartbeat_s: int) -> StackState:
    bucket = name.replace("_", "-")
    return StackState(
        name=name,
        dir=str(directory),
        stack_id=uuid.uuid4().hex,
        postgres_url=admin,
        databases={role: f"{name}_{role}" for role in ("registry", "prefect", "mlflow")},
        buckets={"artifacts": f"{bucket}-artifacts", "mlflow": f"{bucket}-mlflow"},
        pool=pool,
        worker_heartbeat_s=heartbeat_s,
    )


def _check_installed() -> None:
    import importlib.util

    from vfops._errors import MissingExtraError

    if os.name != "posix":  # sessions, posix_spawn, flock
        raise VfopsError("vfops stack needs a POSIX system (Linux, macOS); use infra/compose.yaml")
    for module in ("psutil", "moto", "flask"):  # moto's server mode runs on flask
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError("stack", module)


def stack_up(
    directory: str | Path = DEFAULT_DIR,
    options: StackOptions | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> UpResult:
    """Start the stack in ``directory`` and wait until every service is healthy.

    On a running stack, start only the workers missing to make ``options.workers``. A
    service that fails stops everything this call started and raises a one-line
    :class:`VfopsError` naming it and its log file. ``options.service_env`` and
    ``options.worker_limit`` apply to the services this call starts.
    """
    begun = time.monotonic()
    say = progress or (lambda _message: None)
    options = options or StackOptions()
    extra = options.check()
    name, workers, timeout_s = options.name, options.workers, options.timeout_s
    worker_limit = options.worker_limit
    _check_installed()
    path = Path(directory).resolve()
    with locked(path):
        state = load_state(path)
        if state is not None and name is not None and name != state.name:
            raise VfopsError(
                f"{path} holds stack {state.name!r}, not {name!r}; use another --dir, or "
                f"remove it first: vfops stack down --dir {path} --purge"
            )
        if state is not None and any(running_services(state).values()):
            if worker_limit is not None:  # for the workers started now
                state.worker_limit = worker_limit
            return _grow(state, workers, extra, begun, timeout_s, say)
        admin = admin_url(options.postgres_url)
        if state is None:
            state = _new_state(
                path,
                check_name(name or DEFAULT_NAME),
                admin,
                options.pool,
                options.worker_heartbeat_s,
            )
        else:  # stopped (down without --purge, or died): same databases, new processes
            stop(marked_processes(state.stack_id), grace_s=STOP_GRACE_S)  # stragglers
            state.stack_id = uuid.uuid4().hex
            state.postgres_url = admin
            state.pool = options.pool
            state.worker_heartbeat_s = options.worker_heartbeat_s
            state.services = {}
            state.next_worker = 1
        state.worker_limit = worker_limit
        state.flow_run_launcher = options.flow_run_launcher
        # the databases before the state file: a server that cannot be reached leaves
        # nothing behind to clean up
        created = create_databases(admin, list(state.databases.values()))
        save_state(state)
        say(
            f"databases: {', '.join(state.databases.values())}"
            + (f" (created {', '.join(created)})" if created else " (kept)")
        )
        started: list[ServiceState] = []
        try:
            since = time.time()
            deadline = time.monotonic() + timeout_s
            # the slow ones first: MLflow and Prefect migrate their databases at start
            started.append(start_s3(state, extra.get("s3", {})))
            started.append(start_mlflow(state, extra.get("mlflow", {})))
            started.append(start_prefect(state, extra.get("prefect", {})))
            upgrade_registry(state)
            say(f"registry database {state.databases['registry']} migrated")
            wait_healthy(state, started[:1], deadline, since)
            create_buckets(state)
            say(f"s3 {state.url('s3')} with buckets {', '.join(state.buckets.values())}")
            wait_healthy(state, started[1:], deadline, since)
            say(f"mlflow {state.url('mlflow')}, prefect {state.url('prefect')}")
            create_pool(state)
            new = [start_worker(state, extra.get("worker", {})) for _ in range(workers)]
            started.extend(new)
            wait_healthy(state, new, deadline, since)
        except BaseException:
            stop_services(state, started, grace_s=2.0)
            raise
        return UpResult(state, [s.name for s in started], False, time.monotonic() - begun)


def _grow(
    state: StackState,
    workers: int,
    extra: Mapping[str, Mapping[str, str]],
    begun: float,
    timeout_s: float,
    say: Callable[[str], None],
) -> UpResult:
    running = running_services(state)
    down = [s for s in state.services.values() if s.kind in CORE_KINDS and not running[s.name]]
    missing = [kind for kind in CORE_KINDS if kind not in state.services]
    if down or missing:
        what = down[0].name if down else missing[0]
        log = f" (log: {down[0].log})" if down else ""
        raise VfopsError(
            f"stack {state.name} in {state.dir} is partly down: {what} is not running{log}; "
            f"restart it: vfops stack down --dir {state.dir}, then vfops stack up --dir {state.dir}"
        )
    for service in state.workers():  # a worker that died on its own is replaced
        if not running[service.name]:
            say(f"{service.name} is not running (log: {service.log}); replacing it")
            del state.services[service.name]
    save_state(state)
    count = len(state.workers())
    started: list[ServiceState] = []
    if workers > count:
        since = time.time()
        try:
            for _ in range(workers - count):
                started.append(start_worker(state, extra.get("worker", {})))
            wait_healthy(state, started, time.monotonic() + timeout_s, since)
        except BaseException:
            stop_services(state, started, grace_s=2.0)
            raise
    return UpResult(state, [s.name for s in started], True, time.monotonic() - begun)


def stack_down(
    directory: str | Path = DEFAULT_DIR, *, purge: bool = False
) -> tuple[StackState | None, int]:
    """Stop every process of the stack (SIGTERM, then SIGKILL after a grace period);
    with ``purge`` also drop its databases and remove its files. Returns the state and
    the number of processes signalled."""
    path = Path(directory).resolve()
    if load_state(path) is None:
        return None, 0
    with locked(path):
        state = load_state(path)
        if state is None:
            return None, 0
        count = stop_services(state, list(state.services.values()), grace_s=STOP_GRACE_S)
        leftovers = marked_processes(state.stack_id)  # e.g. flow runs of a killed worker
        count += stop(leftovers, grace_s=STOP_GRACE_S)
        if purge:
            drop_databases(state.postgres_url, list(state.databases.values()))
            _remove_files(path)
    return state, count


def _remove_files(path: Path) -> None:
    """The stack's own files only: the folder may hold the user's too."""
    import shutil

    for sub in ("logs", "prefect-home"):
        shutil.rmtree(path / sub, ignore_errors=True)
    for file in (STATE_FILE, f"{Path(STATE_FILE).stem}.tmp", ".lock"):
        with contextlib.suppress(FileNotFoundError):
            (path / file).unlink()
    with contextlib.suppress(OSError):  # not empty: the user's files stay
        path.rmdir()


def kill_worker(directory: str | Path, worker: str) -> tuple[StackState, int]:
    """SIGKILL a worker's whole process tree and its flow runs at once, as if its
    machine were lost (no goodbye to the server); returns the number of processes."""
    path = Path(directory).resolve()
    _require(path)
    with locked(path):
        state = _require(path)
        service = state.services.get(worker)
        if service is None or service.kind != "worker":
            names = ", ".join(s.name for s in state.workers()) or "none"
            raise VfopsError(
                f"stack {state.name} has no worker {worker!r} (workers: {names}); "
                "see vfops stack status"
            )
        count = stop_services(state, [service], grace_s=0)
    return state, count


def _require(path: Path) -> StackState:
    state = load_state(path)
    if state is None:
        raise VfopsError(f"no stack in {path}; start one with: vfops stack up --dir {path}")
    return state


def stack_env(directory: str | Path = DEFAULT_DIR) -> dict[str, str]:
    """The variables that point vfops, MLflow, Prefect and boto3 at the running stack."""
    state = _require(Path(directory).resolve())
    return client_env(state)


def stack_status(directory: str | Path = DEFAULT_DIR) -> tuple[StackState, list[ServiceStatus]]:
    """Each service: running, healthy, and for workers the pool's view; workers the
    pool knows but the stack no longer runs (killed, lost) are listed too."""
    state = _require(Path(directory).resolve())
    found: list[ServiceStatus] = []
    pool: dict[str, dict[str, Any]] = {}
    prefect = state.services.get("prefect")
    if prefect is not None and alive(prefect.pid, prefect.started):
        with contextlib.suppress(OSError):
            pool = pool_workers(state.url("prefect"), state.pool)
    for service in sorted(
        state.services.values(),
        key=lambda s: (SERVICE_KINDS.index(s.kind), worker_index(s.name)),
    ):
        running = alive(service.pid, service.started)
        if service.kind == "worker":
            seen = pool.get(service.name, {}).get("status", "unknown")
            healthy = running and seen == "ONLINE"
            detail = f"pool {state.pool}: {seen}"
        else:
            healthy = running and is_healthy(state, service, 0.0)
            detail = "answers" if healthy else "does not answer"
        found.append(
            ServiceStatus(
                service.name, service.kind, service.pid, service.url, running, healthy,
                detail if running else "not running", service.log,
            )
        )  # fmt: skip
    for worker_name, worker in sorted(pool.items(), key=lambda kv: worker_index(kv[0])):
        if worker_name not in state.services:
            status = str(worker.get("status", "unknown"))
            found.append(
                ServiceStatus(
                    worker_name, "worker", None, None, False, False,
                    f"pool {state.pool}: {status} (not run by this stack)", None,
                )
            )  # fmt: skip
    return state, found
