"""A stack's settings and its state file: what ``<dir>/stack.json`` holds, read and written.

The state file holds no secret: the PostgreSQL URL may not carry a password (libpq's
``PGPASSWORD`` does, and every service inherits it), and the S3 keys come from the
environment at every command. One stack command at a time per folder (:func:`locked`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final

from vfops._errors import VfopsError

DEFAULT_DIR: Final = ".vfops-stack"
DEFAULT_NAME: Final = "vfops_stack"
DEFAULT_WORKERS: Final = 2
DEFAULT_POOL: Final = "vfops-process"  # vfops deploy's default pool: deploy needs no flag
DEFAULT_POSTGRES_URL: Final = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_TIMEOUT_S: Final = 300.0
DEFAULT_WORKER_HEARTBEAT_S: Final = 30  # Prefect's default (whole seconds: its API's type)
FLOW_RUN_HEARTBEAT_S: Final = 30  # flow-run heartbeats: how a lost worker's runs are found
WORKER_QUERY_S: Final = 1.0
"""How often a worker asks for scheduled flow runs (``PREFECT_WORKER_QUERY_SECONDS``;
Prefect's default is 10): a cell waits half of it on average before a worker takes it.
Measured on 2 cores (infra/README.md, "Cells that start in seconds"): 1 s keeps that wait
at ~0.5 s while the Prefect server spends ~10 % of a core answering 4 idle workers (10 s:
3 %, 2 s: 5 %, 0.5 s: 18 %, for another ~0.25 s). Override per stack with
``--service-env worker:PREFECT_WORKER_QUERY_SECONDS=S``."""
FLOW_RUN_LAUNCHERS: Final = ("engine", "workspace")
DEFAULT_FLOW_RUN_LAUNCHER: Final = "engine"
"""How the stack's workers start a flow run: ``engine``, one interpreter (the pool's
command: :mod:`vfops.orchestration._engine`, Prefect's engine started and ended
sooner); ``workspace``, Prefect 3.9's own (a workspace supervisor interpreter, then the
engine's). See :func:`vfops.orchestration.process_job_template`."""

POSTGRES_URL_VAR: Final = "VFOPS_STACK_POSTGRES_URL"
ACCESS_KEY_VAR: Final = "VFOPS_STACK_S3_ACCESS_KEY_ID"
SECRET_KEY_VAR: Final = "VFOPS_STACK_S3_SECRET_ACCESS_KEY"
# moto accepts any key pair: these defaults are for a loopback test server only
TEST_ACCESS_KEY_ID: Final = "vfops-stack-test-key"
TEST_SECRET_ACCESS_KEY: Final = "vfops-stack-test-secret"
REGION: Final = "us-east-1"

STATE_FILE: Final = "stack.json"
SERVICE_KINDS: Final = ("s3", "mlflow", "prefect", "worker")
CORE_KINDS: Final = ("s3", "mlflow", "prefect")
_NAME_RE: Final = re.compile(r"[a-z][a-z0-9_]{0,39}")
_WORKER_RE: Final = re.compile(r"worker-(\d+)")
STOP_GRACE_S: Final = 10.0


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
    flow_run_launcher: str = DEFAULT_FLOW_RUN_LAUNCHER  # the pool's, set at every up

    @property
    def path(self) -> Path:
        return Path(self.dir)

    def service(self, kind: str) -> ServiceState | None:
        return self.services.get(kind)

    def workers(self) -> list[ServiceState]:
        found = [s for s in self.services.values() if s.kind == "worker"]
        return sorted(found, key=lambda s: worker_index(s.name))

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
class StackOptions:
    """What ``stack_up`` starts (the CLI's ``vfops stack up`` flags; a new one is a field)."""

    workers: int = DEFAULT_WORKERS
    """Prefect process workers; on a running stack, the missing ones start."""
    name: str | None = None
    """The stack's name, prefixing its databases (default: ``DEFAULT_NAME``)."""
    postgres_url: str | None = None
    """The PostgreSQL server, without password (default: ``$VFOPS_STACK_POSTGRES_URL``)."""
    pool: str = DEFAULT_POOL
    worker_heartbeat_s: int = DEFAULT_WORKER_HEARTBEAT_S
    worker_limit: int | None = None
    """Flow runs each worker started now runs at once (``prefect worker start --limit``;
    None: no cap)."""
    flow_run_launcher: str = DEFAULT_FLOW_RUN_LAUNCHER
    """How the workers start a flow run (``engine`` or ``workspace``); set on the stack's
    pool when the stack starts (on a running stack it stays as it is)."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    service_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Variables for the services of one kind started now (``{"prefect": {...}}``); not
    for secrets (on the CLI they are on the command line)."""

    def check(self) -> dict[str, dict[str, str]]:
        """Refuse a bad value in one line naming its flag; the checked ``service_env``."""
        if self.workers < 0:
            raise VfopsError(f"--workers must be 0 or more, not {self.workers}")
        if self.worker_heartbeat_s < 1:
            raise VfopsError(
                f"--worker-heartbeat must be 1 second or more, not {self.worker_heartbeat_s}"
            )
        if self.worker_limit is not None and self.worker_limit < 1:
            raise VfopsError(f"--worker-limit must be 1 or more, not {self.worker_limit}")
        if self.flow_run_launcher not in FLOW_RUN_LAUNCHERS:
            raise VfopsError(
                f"--flow-run-launcher must be one of {', '.join(FLOW_RUN_LAUNCHERS)}, "
                f"not {self.flow_run_launcher!r}"
            )
        if not self.timeout_s > 0:
            raise VfopsError(f"--timeout must be positive, not {self.timeout_s}")
        return check_service_env(self.service_env)


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


def check_name(name: str) -> str:
    if not _NAME_RE.fullmatch(name):
        raise VfopsError(
            f"stack name {name!r} is not valid; use 1-40 lowercase letters, digits and "
            "underscores, starting with a letter (it prefixes the database names)"
        )
    return name


def admin_url(raw: str | None) -> str:
    """The PostgreSQL server's URL (any database; the stack creates its own), checked."""
    from vfops.registry import url_backend, url_with

    text = raw or os.environ.get(POSTGRES_URL_VAR) or DEFAULT_POSTGRES_URL
    parts = url_backend(text)
    if parts is None:
        raise VfopsError(  # not echoed: it may hold a password
            "--postgres-url is not a database URL; use postgresql://USER@HOST:PORT/postgres"
        )
    backend, has_password = parts
    if backend != "postgresql":
        raise VfopsError(
            f"--postgres-url must be a PostgreSQL URL, not {backend!r}; "
            "use postgresql://USER@HOST:PORT/postgres"
        )
    if has_password:
        raise VfopsError(
            "--postgres-url must not contain a password (it is written to the stack's "
            "state file and printed); put the password in PGPASSWORD instead"
        )
    return url_with(text, driver="postgresql")


def database_url(admin: str, database: str, driver: str) -> str:
    from vfops.registry import url_with

    return url_with(admin, driver=f"postgresql+{driver}", database=database)


def check_service_env(pairs: Mapping[str, Mapping[str, str]] | None) -> dict[str, dict[str, str]]:
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
    return check_service_env(found)


def worker_index(name: str) -> int:
    match = _WORKER_RE.fullmatch(name)
    return int(match.group(1)) if match else 0


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


def save_state(state: StackState) -> None:
    path = state_path(state.path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
    tmp.replace(path)  # a reader never sees half a file


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
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
