"""The production topology (infra/compose.yaml) as local processes, without containers.

One PostgreSQL server (the machine's own) holds three databases: the vfops registry,
Prefect's and MLflow's. moto's S3 server stands in for MinIO, on loopback, with the
stack's two buckets. MLflow's tracking server keeps runs in PostgreSQL and proxies
artifacts to S3; Prefect's server runs on PostgreSQL; the registry is migrated with
``vfops db upgrade``'s function; N Prefect process workers serve one work pool.

Every process runs detached (a session of its own); pids, ports and log files are in
``<dir>/stack.json``, the logs in ``<dir>/logs/``. The state file holds no secret: the
PostgreSQL URL may not carry a password (libpq's ``PGPASSWORD`` does, and every
service inherits it), and the S3 keys come from the environment at every command.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from vfops._errors import VfopsError
from vfops._json_http import json_request
from vfops.stack._process import (
    SERVICE_VAR,
    STACK_ID_VAR,
    alive,
    marked_processes,
    reap,
    service_processes,
    spawn,
    stop,
)

if TYPE_CHECKING:
    from psutil import Process
    from psycopg import Connection

DEFAULT_DIR: Final = ".vfops-stack"
DEFAULT_NAME: Final = "vfops_stack"
DEFAULT_WORKERS: Final = 2
DEFAULT_POOL: Final = "vfops-process"  # vfops deploy's default pool: deploy needs no flag
DEFAULT_POSTGRES_URL: Final = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_TIMEOUT_S: Final = 300.0
DEFAULT_WORKER_HEARTBEAT_S: Final = 30  # Prefect's default (whole seconds: its API's type)
FLOW_RUN_HEARTBEAT_S: Final = 30  # flow-run heartbeats: how a lost worker's runs are found

POSTGRES_URL_VAR: Final = "VFOPS_STACK_POSTGRES_URL"
ACCESS_KEY_VAR: Final = "VFOPS_STACK_S3_ACCESS_KEY_ID"
SECRET_KEY_VAR: Final = "VFOPS_STACK_S3_SECRET_ACCESS_KEY"
# moto accepts any key pair: these defaults are for a loopback test server only
TEST_ACCESS_KEY_ID: Final = "vfops-stack-test-key"
TEST_SECRET_ACCESS_KEY: Final = "vfops-stack-test-secret"
REGION: Final = "us-east-1"

STATE_FILE: Final = "stack.json"
SERVICE_KINDS: Final = ("s3", "mlflow", "prefect", "worker")
_CORE: Final = ("s3", "mlflow", "prefect")
_NAME_RE: Final = re.compile(r"[a-z][a-z0-9_]{0,39}")
_WORKER_RE: Final = re.compile(r"worker-(\d+)")
_STOP_GRACE_S: Final = 10.0
# what a service must not inherit from the caller: it gets the stack's own values
_OWN_PREFIXES: Final = ("AWS_", "MLFLOW_", "PREFECT_")
_OWN_VARS: Final = frozenset({"VFOPS_DATABASE_URL", "VFOPS_ARTIFACTS", "VFOPS_S3_ENDPOINT_URL"})


@dataclass
class ServiceState:
    """One running process of the stack."""

    name: str  # "s3", "mlflow", "prefect", "worker-1", ...
    kind: str  # one of SERVICE_KINDS
    pid: int
    started: float  # the process's start time: a reused pid is not mistaken for it
    log: str
    url: str | None = None
    port: int | None = None


@dataclass
class StackState:
    """What ``<dir>/stack.json`` holds (no secret)."""

    name: str
    dir: str
    stack_id: str
    postgres_url: str  # the server's admin URL, without password
    databases: dict[str, str]  # "registry" | "prefect" | "mlflow" -> database name
    buckets: dict[str, str]  # "artifacts" | "mlflow" -> bucket
    pool: str
    worker_heartbeat_s: int
    services: dict[str, ServiceState] = field(default_factory=dict)
    next_worker: int = 1
    worker_limit: int | None = None  # flow runs at once per worker (None: Prefect's, no limit)

    @property
    def path(self) -> Path:
        return Path(self.dir)

    def service(self, kind: str) -> ServiceState | None:
        return self.services.get(kind)

    def workers(self) -> list[ServiceState]:
        found = [s for s in self.services.values() if s.kind == "worker"]
        return sorted(found, key=lambda s: _worker_index(s.name))

    def url(self, kind: str) -> str:
        service = self.services.get(kind)
        if service is None or service.url is None:
            raise VfopsError(
                f"stack {self.name} in {self.dir} has no running {kind}; "
                f"start it with: vfops stack up --dir {self.dir}"
            )
        return service.url


@dataclass(frozen=True)
class ServiceStatus:
    """A service as ``vfops stack status`` shows it."""

    name: str
    kind: str
    pid: int | None
    url: str | None
    running: bool
    healthy: bool
    detail: str
    log: str | None


@dataclass(frozen=True)
class UpResult:
    """What ``stack_up`` did: ``started`` names the services it started."""

    state: StackState
    started: list[str]
    already_running: bool
    seconds: float


# ---------------------------------------------------------------- settings


def s3_keys() -> tuple[str, str]:
    """The S3 key pair the stack's services and clients use (env, else test-only defaults)."""
    return (
        os.environ.get(ACCESS_KEY_VAR) or TEST_ACCESS_KEY_ID,
        os.environ.get(SECRET_KEY_VAR) or TEST_SECRET_ACCESS_KEY,
    )


def _check_name(name: str) -> str:
    if not _NAME_RE.fullmatch(name):
        raise VfopsError(
            f"stack name {name!r} is not valid; use 1-40 lowercase letters, digits and "
            "underscores, starting with a letter (it prefixes the database names)"
        )
    return name


def _admin_url(raw: str | None) -> str:
    """The PostgreSQL server's URL (any database; the stack creates its own), checked."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    text = raw or os.environ.get(POSTGRES_URL_VAR) or DEFAULT_POSTGRES_URL
    try:
        url = make_url(text)
    except ArgumentError:
        raise VfopsError(  # not echoed: it may hold a password
            "--postgres-url is not a database URL; use postgresql://USER@HOST:PORT/postgres"
        ) from None
    if url.get_backend_name() != "postgresql":
        raise VfopsError(
            f"--postgres-url must be a PostgreSQL URL, not {url.get_backend_name()!r}; "
            "use postgresql://USER@HOST:PORT/postgres"
        )
    if url.password is not None:
        raise VfopsError(
            "--postgres-url must not contain a password (it is written to the stack's "
            "state file and printed); put the password in PGPASSWORD instead"
        )
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def _database_url(admin: str, database: str, driver: str) -> str:
    from sqlalchemy.engine import make_url

    url = make_url(admin).set(drivername=f"postgresql+{driver}", database=database)
    return url.render_as_string(hide_password=False)


def _parse_service_env(pairs: Mapping[str, Mapping[str, str]] | None) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    for kind, values in (pairs or {}).items():
        if kind not in SERVICE_KINDS:
            raise VfopsError(
                f"unknown service {kind!r} in --service-env; use one of {', '.join(SERVICE_KINDS)}"
            )
        found[kind] = dict(values)
    return found


def parse_service_env_option(items: list[str]) -> dict[str, dict[str, str]]:
    """``["prefect:KEY=VALUE", ...]`` (the CLI's ``--service-env``) as ``{kind: {KEY: VALUE}}``."""
    found: dict[str, dict[str, str]] = {}
    for item in items:
        kind, sep, assignment = item.partition(":")
        key, eq, value = assignment.partition("=")
        if not sep or not eq or not key:
            raise VfopsError(
                f"--service-env {item!r} is not SERVICE:NAME=VALUE (e.g. "
                "prefect:PREFECT_SERVER_LOGGING_LEVEL=DEBUG)"
            )
        found.setdefault(kind, {})[key] = value
    return _parse_service_env(found)


# ---------------------------------------------------------------- state file


def state_path(directory: Path) -> Path:
    return directory / STATE_FILE


def load_state(directory: str | Path) -> StackState | None:
    """The stack recorded in ``directory``, or None when there is none."""
    path = state_path(Path(directory).resolve())
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise VfopsError(
            f"{path} cannot be read ({exc}); stop its processes by hand and remove it"
        ) from None
    services = {k: ServiceState(**v) for k, v in raw.pop("services", {}).items()}
    return StackState(**raw, services=services)


def _save(state: StackState) -> None:
    path = state_path(state.path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
    tmp.replace(path)  # a reader never sees half a file


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One stack command at a time per folder (two ``up`` would start two stacks)."""
    import fcntl

    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise VfopsError(
                f"another vfops stack command is running on {directory}; wait for it to finish"
            ) from None
        yield


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


def _pool_workers(state: StackState) -> dict[str, dict[str, Any]]:
    """The work pool's workers as the Prefect API reports them, by name."""
    api = state.url("prefect")
    status, payload = _http("POST", f"{api}/work_pools/{state.pool}/workers/filter", {})
    if status != 200 or not isinstance(payload, list):
        return {}
    return {str(w["name"]): w for w in payload if isinstance(w, dict) and "name" in w}


def _heartbeat_after(worker: Mapping[str, Any], since: float) -> bool:
    beat = worker.get("last_heartbeat_time")
    if not beat:
        return False
    try:
        when = datetime.fromisoformat(str(beat).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return False
    return when >= since - 1.0  # clocks of one machine; a second for rounding


# ---------------------------------------------------------------- services


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    registry = _database_url(state.postgres_url, state.databases["registry"], "psycopg")
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
    _save(state)  # at once: a stack command that dies now leaves nothing untracked
    return service


def _start_s3(state: StackState, extra: Mapping[str, str]) -> ServiceState:
    port = _free_port()
    argv = [_python(), "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    env = {**_base_env(state, "s3"), **extra}
    return _start(state, "s3", "s3", argv, env, url=f"http://127.0.0.1:{port}", port=port)


def _start_mlflow(state: StackState, extra: Mapping[str, str]) -> ServiceState:
    port = _free_port()
    backend = _database_url(state.postgres_url, state.databases["mlflow"], "psycopg")
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


def _start_prefect(state: StackState, extra: Mapping[str, str]) -> ServiceState:
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    database = _database_url(state.postgres_url, state.databases["prefect"], "asyncpg")
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


def _start_worker(state: StackState, extra: Mapping[str, str]) -> ServiceState:
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
        **extra,
    }
    return _start(state, name, "worker", argv, env)


def _worker_index(name: str) -> int:
    match = _WORKER_RE.fullmatch(name)
    return int(match.group(1)) if match else 0


# ---------------------------------------------------------------- health


def _healthy(state: StackState, service: ServiceState, since: float) -> bool:
    if service.kind == "s3":  # moto answers any request (a ListBuckets here)
        return _answers(f"{service.url}/", ok_only=False)
    if service.kind == "mlflow":
        return _answers(f"{service.url}/health", ok_only=True)
    if service.kind == "prefect":
        return _answers(f"{service.url}/health", ok_only=True)
    try:
        worker = _pool_workers(state).get(service.name)
    except OSError:
        return False
    return (
        worker is not None and worker.get("status") == "ONLINE" and _heartbeat_after(worker, since)
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


def _wait_healthy(
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
            if _healthy(state, service, since):
                pending.remove(service)
        if pending and time.monotonic() > deadline:
            late = pending[0]
            raise _failure(late, "did not become healthy in time (raise --timeout if slow)")
        if pending:
            time.sleep(0.25)


# ---------------------------------------------------------------- PostgreSQL, S3


def _connect(admin: str) -> Connection[Any]:
    import psycopg

    try:
        return psycopg.connect(admin, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        reason = " ".join(str(exc).split())
        raise VfopsError(
            f"PostgreSQL is not reachable at {admin} ({reason}); start it, or point "
            f"--postgres-url ({POSTGRES_URL_VAR}) at a server this user may create databases on"
        ) from None


def _create_databases(admin: str, names: list[str]) -> list[str]:
    """Create each missing database; returns those created."""
    from psycopg import sql

    created = []
    with _connect(admin) as connection:
        for name in names:
            row = connection.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if row is None:
                connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                created.append(name)
    return created


def _drop_databases(admin: str, names: list[str]) -> None:
    from psycopg import sql

    with _connect(admin) as connection:
        for name in names:
            # FORCE: a connection left by a killed client must not keep it alive
            connection.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _create_buckets(state: StackState) -> None:
    import boto3

    access, secret = s3_keys()
    client = boto3.session.Session(aws_access_key_id=access, aws_secret_access_key=secret).client(
        "s3", endpoint_url=state.url("s3"), region_name=REGION
    )
    try:
        existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        for bucket in state.buckets.values():
            if bucket not in existing:
                client.create_bucket(Bucket=bucket)
    finally:
        client.close()


def _upgrade_registry(state: StackState) -> None:
    from vfops.registry import dispose_engines, upgrade

    url = _database_url(state.postgres_url, state.databases["registry"], "psycopg")
    try:
        upgrade(url)
    except VfopsError as exc:
        raise VfopsError(f"registry database {state.databases['registry']}: {exc}") from None
    finally:
        dispose_engines()


def _create_pool(state: StackState) -> None:
    api = state.url("prefect")
    status, payload = _http(
        "POST", f"{api}/work_pools/", {"name": state.pool, "type": "process"}, timeout=30
    )
    if status not in (200, 201, 409):  # 409: it exists (kept databases)
        detail = payload.get("detail") if isinstance(payload, dict) else payload
        raise VfopsError(
            f"Prefect refused to create work pool {state.pool!r} (HTTP {status}: {detail}); "
            f"see {state.services['prefect'].log}"
        )


# ---------------------------------------------------------------- commands


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


def _running(state: StackState) -> dict[str, bool]:
    return {name: alive(s.pid, s.started) for name, s in state.services.items()}


def stack_up(
    directory: str | Path = DEFAULT_DIR,
    *,
    workers: int = DEFAULT_WORKERS,
    name: str | None = None,
    postgres_url: str | None = None,
    pool: str = DEFAULT_POOL,
    worker_heartbeat_s: int = DEFAULT_WORKER_HEARTBEAT_S,
    worker_limit: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    service_env: Mapping[str, Mapping[str, str]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> UpResult:
    """Start the stack in ``directory`` and wait until every service is healthy.

    On a running stack, start only the workers missing to make ``workers``. A service
    that fails stops everything this call started and raises a one-line
    :class:`VfopsError` naming it and its log file. ``service_env`` adds variables to
    the services of one kind (``{"prefect": {"PREFECT_SERVER_LOGGING_LEVEL": "DEBUG"}}``)
    started by this call; not for secrets (on the CLI they are on the command line).
    ``worker_limit`` caps the flow runs each worker started by this call runs at once
    (``prefect worker start --limit``; None: no cap).
    """
    begun = time.monotonic()
    say = progress or (lambda _message: None)
    if workers < 0:
        raise VfopsError(f"--workers must be 0 or more, not {workers}")
    if worker_heartbeat_s < 1:
        raise VfopsError(f"--worker-heartbeat must be 1 second or more, not {worker_heartbeat_s}")
    if worker_limit is not None and worker_limit < 1:
        raise VfopsError(f"--worker-limit must be 1 or more, not {worker_limit}")
    if not timeout_s > 0:
        raise VfopsError(f"--timeout must be positive, not {timeout_s}")
    extra = _parse_service_env(service_env)
    _check_installed()
    path = Path(directory).resolve()
    with _locked(path):
        state = load_state(path)
        if state is not None and name is not None and name != state.name:
            raise VfopsError(
                f"{path} holds stack {state.name!r}, not {name!r}; use another --dir, or "
                f"remove it first: vfops stack down --dir {path} --purge"
            )
        if state is not None and any(_running(state).values()):
            if worker_limit is not None:  # for the workers started now
                state.worker_limit = worker_limit
            return _grow(state, workers, extra, begun, timeout_s, say)
        admin = _admin_url(postgres_url)
        if state is None:
            state = _new_state(
                path, _check_name(name or DEFAULT_NAME), admin, pool, worker_heartbeat_s
            )
        else:  # stopped (down without --purge, or died): same databases, new processes
            stop(marked_processes(state.stack_id), grace_s=_STOP_GRACE_S)  # stragglers
            state.stack_id = uuid.uuid4().hex
            state.postgres_url = admin
            state.pool = pool
            state.worker_heartbeat_s = worker_heartbeat_s
            state.services = {}
            state.next_worker = 1
        state.worker_limit = worker_limit
        # the databases before the state file: a server that cannot be reached leaves
        # nothing behind to clean up
        created = _create_databases(admin, list(state.databases.values()))
        _save(state)
        say(
            f"databases: {', '.join(state.databases.values())}"
            + (f" (created {', '.join(created)})" if created else " (kept)")
        )
        started: list[ServiceState] = []
        try:
            since = time.time()
            deadline = time.monotonic() + timeout_s
            # the slow ones first: MLflow and Prefect migrate their databases at start
            started.append(_start_s3(state, extra.get("s3", {})))
            started.append(_start_mlflow(state, extra.get("mlflow", {})))
            started.append(_start_prefect(state, extra.get("prefect", {})))
            _upgrade_registry(state)
            say(f"registry database {state.databases['registry']} migrated")
            _wait_healthy(state, started[:1], deadline, since)
            _create_buckets(state)
            say(f"s3 {state.url('s3')} with buckets {', '.join(state.buckets.values())}")
            _wait_healthy(state, started[1:], deadline, since)
            say(f"mlflow {state.url('mlflow')}, prefect {state.url('prefect')}")
            _create_pool(state)
            new = [_start_worker(state, extra.get("worker", {})) for _ in range(workers)]
            started.extend(new)
            _wait_healthy(state, new, deadline, since)
        except BaseException:
            _stop_services(state, started, grace_s=2.0)
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
    running = _running(state)
    down = [s for s in state.services.values() if s.kind in _CORE and not running[s.name]]
    missing = [kind for kind in _CORE if kind not in state.services]
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
    _save(state)
    count = len(state.workers())
    started: list[ServiceState] = []
    if workers > count:
        since = time.time()
        try:
            for _ in range(workers - count):
                started.append(_start_worker(state, extra.get("worker", {})))
            _wait_healthy(state, started, time.monotonic() + timeout_s, since)
        except BaseException:
            _stop_services(state, started, grace_s=2.0)
            raise
    return UpResult(state, [s.name for s in started], True, time.monotonic() - begun)


def _stop_services(state: StackState, services: list[ServiceState], *, grace_s: float) -> int:
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
        _save(state)
    return count


def stack_down(
    directory: str | Path = DEFAULT_DIR, *, purge: bool = False
) -> tuple[StackState | None, int]:
    """Stop every process of the stack (SIGTERM, then SIGKILL after a grace period);
    with ``purge`` also drop its databases and remove its files. Returns the state and
    the number of processes signalled."""
    path = Path(directory).resolve()
    if load_state(path) is None:
        return None, 0
    with _locked(path):
        state = load_state(path)
        if state is None:
            return None, 0
        count = _stop_services(state, list(state.services.values()), grace_s=_STOP_GRACE_S)
        leftovers = marked_processes(state.stack_id)  # e.g. flow runs of a killed worker
        count += stop(leftovers, grace_s=_STOP_GRACE_S)
        if purge:
            _drop_databases(state.postgres_url, list(state.databases.values()))
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
    with _locked(path):
        state = _require(path)
        service = state.services.get(worker)
        if service is None or service.kind != "worker":
            names = ", ".join(s.name for s in state.workers()) or "none"
            raise VfopsError(
                f"stack {state.name} has no worker {worker!r} (workers: {names}); "
                "see vfops stack status"
            )
        count = _stop_services(state, [service], grace_s=0)
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
            pool = _pool_workers(state)
    for service in sorted(
        state.services.values(),
        key=lambda s: (SERVICE_KINDS.index(s.kind), _worker_index(s.name)),
    ):
        running = alive(service.pid, service.started)
        if service.kind == "worker":
            seen = pool.get(service.name, {}).get("status", "unknown")
            healthy = running and seen == "ONLINE"
            detail = f"pool {state.pool}: {seen}"
        else:
            healthy = running and _healthy(state, service, 0.0)
            detail = "answers" if healthy else "does not answer"
        found.append(
            ServiceStatus(
                service.name, service.kind, service.pid, service.url, running, healthy,
                detail if running else "not running", service.log,
            )
        )  # fmt: skip
    for worker_name, worker in sorted(pool.items(), key=lambda kv: _worker_index(kv[0])):
        if worker_name not in state.services:
            status = str(worker.get("status", "unknown"))
            found.append(
                ServiceStatus(
                    worker_name, "worker", None, None, False, False,
                    f"pool {state.pool}: {status} (not run by this stack)", None,
                )
            )  # fmt: skip
    return state, found
