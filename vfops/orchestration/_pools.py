"""Work pools: created once, whoever asks first (``vfops deploy``, ``vfops stack up``).

A pool is created with its type's default job template, taken from the installed worker
class or from the worker metadata bundled with Prefect: no network (the public
collection registry may be out of reach) and no worker of that type needed. An existing
pool is used as it is, whatever its type: an operator's pool is never changed here.
The local stack's pool is the stack's own: :func:`put_work_pool` sets its template (how
its flow runs start, :func:`process_job_template`) at every ``vfops stack up``.
"""

from __future__ import annotations

import json
import shlex
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from vfops._errors import InvalidArgumentError, VfopsError
from vfops._json_http import json_request

if TYPE_CHECKING:
    from prefect.client.orchestration import PrefectClient

PoolType = Literal["process", "docker", "kubernetes"]
POOL_TYPES: tuple[str, ...] = get_args(PoolType)
IMAGE_POOL_TYPES = frozenset({"docker", "kubernetes"})
"""Pool types whose flow runs run in an image (a deployment must name one)."""


def default_job_template(pool_type: str) -> dict[str, Any]:
    """The base job template of a ``pool_type`` pool (see the module's docstring)."""
    from prefect.workers.base import BaseWorker

    worker_class = BaseWorker.get_worker_class_from_type(pool_type)
    if worker_class is not None:
        return dict(worker_class.get_default_base_job_template())
    import prefect.server.api as server_api

    bundled = (
        Path(server_api.__file__).parent
        / "collections_data"
        / "views"
        / "aggregate-worker-metadata.json"
    )
    for collection in json.loads(bundled.read_text()).values():
        for worker in collection.values():
            if worker.get("type") == pool_type:
                return dict(worker["default_base_job_configuration"])
    raise InvalidArgumentError(f"no job template for work pool type {pool_type!r}")


ENGINE_MODULE = "vfops.orchestration._engine"
"""Prefect's engine as one interpreter, started and ended sooner (its docstring says how)."""


def engine_command(python: str) -> str:
    """The command that starts a flow run as one interpreter: ``PYTHON -m
    vfops.orchestration._engine`` (``python -m prefect.engine``, started and ended
    sooner; the run's id comes in ``PREFECT__FLOW_RUN_ID``, set by the worker)."""
    return shlex.join([python, "-m", ENGINE_MODULE])


def process_job_template(command: str | None = None) -> dict[str, Any]:
    """The process pool's default job template; with ``command``, every flow run of the
    pool starts with it unless its deployment sets another.

    Why a command: without one, Prefect 3.9's process worker starts each flow run as a
    workspace supervisor (an interpreter that imports Prefect, runs the deployment's pull
    steps and then execs ``python -m prefect.engine``, a second interpreter importing
    Prefect again). With a command the worker starts the engine at once and the engine
    runs the pull steps itself: one interpreter (infra/README.md, "Cells that start in
    seconds", has the figures). Lost with the supervisor: its dependency auto-install
    (``PREFECT_RUNNER_AUTO_INSTALL_DEPENDENCIES``, off by default) and a session of its
    own per flow run (the run stays in its worker's).
    """
    template = default_job_template("process")
    if command is not None:
        template["variables"]["properties"]["command"]["default"] = command
    return template


def prefect_client(api_url: str | None = None) -> AbstractAsyncContextManager[PrefectClient]:
    """A client of the configured Prefect API, or of ``api_url`` (a server this process
    started, on loopback: no proxy from the environment is asked for it)."""
    from prefect.client.orchestration import PrefectClient, get_client

    if api_url is None:
        return get_client()
    return PrefectClient(api_url, httpx_settings={"trust_env": False})


async def ensure_work_pool(
    name: str, pool_type: str = "process", *, api_url: str | None = None
) -> str:
    """Create the work pool ``name`` of ``pool_type`` unless it exists; the pool's type
    (an existing pool is used as it is, whatever its type). ``api_url``: the Prefect
    API to ask (default: the configured one)."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    if pool_type not in POOL_TYPES:
        raise VfopsError(f"unknown work pool type {pool_type!r}; use one of {POOL_TYPES}")
    async with prefect_client(api_url) as client:
        try:
            return str((await client.read_work_pool(name)).type)
        except ObjectNotFound:
            pass
        create = WorkPoolCreate(
            name=name, type=pool_type, base_job_template=default_job_template(pool_type)
        )
        try:
            return str((await client.create_work_pool(create)).type)
        except ObjectAlreadyExists:  # created by a concurrent vfops deploy
            return str((await client.read_work_pool(name)).type)


async def put_work_pool(
    name: str, pool_type: str, base_job_template: dict[str, Any], *, api_url: str | None = None
) -> None:
    """Create the work pool ``name`` with ``base_job_template``, or set that template on
    the existing one: for a pool that belongs to its caller (the local stack's), never
    an operator's (:func:`ensure_work_pool` leaves those as they are)."""
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectAlreadyExists

    async with prefect_client(api_url) as client:
        try:
            await client.create_work_pool(
                WorkPoolCreate(name=name, type=pool_type, base_job_template=base_job_template)
            )
        except ObjectAlreadyExists:  # kept databases: the pool of the stack's last run
            await client.update_work_pool(name, WorkPoolUpdate(base_job_template=base_job_template))


def pool_workers(api_url: str, pool: str, *, timeout_s: float = 5.0) -> dict[str, dict[str, Any]]:
    """The work pool's workers as the Prefect API reports them, by name ({} when the
    API does not answer with a list). Plain HTTP, not Prefect's client: a health check
    polled four times a second must not import Prefect. An unreachable server raises
    OSError."""
    status, payload = json_request(
        "POST", f"{api_url}/work_pools/{pool}/workers/filter", {}, timeout_s=timeout_s,
        proxies=False,
    )  # fmt: skip
    if status != 200 or not isinstance(payload, list):
        return {}
    return {str(w["name"]): w for w in payload if isinstance(w, dict) and "name" in w}


def heartbeat_after(worker: dict[str, Any], since: float) -> bool:
    """Whether a worker (as :func:`pool_workers` reports it) beat at ``since`` or later."""
    beat = worker.get("last_heartbeat_time")
    if not beat:
        return False
    try:
        when = datetime.fromisoformat(str(beat).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return False
    return when >= since - 1.0  # clocks of one machine; a second for rounding
