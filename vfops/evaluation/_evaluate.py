"""One entry point for an evaluation: :func:`evaluate_async` (and :func:`evaluate`).

Every caller — ``vfops eval``, sweep and nightly cells, promotion gates, the
environments' own tests — runs an evaluation through it, so every run lands in
the same places with the same provenance:

1. the tracker (MLflow) starts first, in its own process, so its start-up
   overlaps everything below;
2. the environment loads and the model is resolved and checked (bad input
   fails here, before any run is recorded);
3. the run is opened: created, resumed (``resume=`` a run id, id prefix or run
   folder; or ``existing="resume"``: the newest unfinished run with the same
   configuration fingerprint) or reused (``existing="reuse"``: a completed run
   with that fingerprint; nothing is generated);
4. rollouts run with bounded concurrency; each scored group goes to the run
   folder first, then to the sinks (registry, Arrow export, MLflow, progress);
5. the sinks are closed and the run is finished: ``completed``, ``failed`` (a
   sink failed or the evaluation raised: the message names what and how to
   finish it) or ``interrupted`` (cancelled; the cancellation propagates).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from vfops._errors import VfopsError
from vfops._paths import check_writable_folder
from vfops._rollout import RolloutRecord
from vfops._settings import registry_retry_s, scoring_timeout_s
from vfops._twins import blocking_twin
from vfops.budget import AdaptiveLimiter
from vfops.clients._base import ModelClient
from vfops.costs import (
    BUDGET_EXHAUSTED_EXIT_CODE,
    BudgetExhausted,
    RegistryLedger,
    set_caps,
    use_ledger,
)
from vfops.evaluation._lock import RunFolderLock
from vfops.evaluation._model import ModelOptions, connect_model
from vfops.evaluation._runner import (
    EvalRequest,
    check_resumable,
    initial_metadata,
    new_run_dir,
    now_iso,
    run_rollouts,
)
from vfops.evaluation._sinks import (
    ArrowSink,
    RegistrySink,
    RunFinish,
    Sink,
    SinkError,
    TrackerExportSink,
    TrackingSink,
    first_line,
)
from vfops.evaluation._store import (
    ARROW_FILE,
    DiskWriteError,
    RolloutWriter,
    iter_records,
    read_metadata,
    write_metadata,
)
from vfops.stats._summary import EvalSummary

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from vfops._lease import LeaseOwner
    from vfops.envs._environment import Environment
    from vfops.evaluation._provenance import Provenance
    from vfops.evaluation._registry_calls import RegistryCalls
    from vfops.publishing._provenance import InstalledEnvironment
    from vfops.tracking import Tracker

Action = Literal["created", "resumed", "reused"]
Existing = Literal["new", "resume", "reuse"]
Outcome = Literal["completed", "completed_with_errors", "interrupted", "failed", "budget_exhausted"]
DEFAULT_OUTPUT_ROOT = Path("outputs")
DEFAULT_MAX_ERROR_RATE: Final = 0.0
"""The share of errored rollouts above which a completed run is reported as
``completed_with_errors`` (``vfops eval --max-error-rate``): by default any error."""
EXIT_CODES: Final[dict[Outcome, int]] = {
    "completed": 0,
    "failed": 1,
    # 2 is bad input (VfopsError), caught before a run is recorded
    "completed_with_errors": 3,
    # 4: the run is busy (another process holds its lease or folder lock): RunBusyError
    "interrupted": 130,  # 128 + SIGINT; SIGTERM exits 143 (the CLI knows which came)
    "budget_exhausted": BUDGET_EXHAUSTED_EXIT_CODE,  # a cost cap stopped it; resumable
}

_CATCH_UP_BATCH = 512


@dataclass
class EvalResult:
    """How an evaluation ended, and where it is recorded."""

    run_dir: Path | None
    summary: EvalSummary
    status: str
    """``completed``, ``failed``, ``interrupted`` or ``budget_exhausted``."""
    metadata: dict[str, Any]
    run_id: str | None = None
    """The registry run (``None`` without the registry)."""
    action: Action = "created"
    mlflow_run_id: str | None = None
    error: str | None = None
    """Why a failed run failed, and how to finish it."""

    def outcome(self, max_error_rate: float = DEFAULT_MAX_ERROR_RATE) -> Outcome:
        """What happened, in one word: ``completed``, ``completed_with_errors`` (more
        than ``max_error_rate`` of the rollouts errored, or every one did),
        ``interrupted`` or ``failed``."""
        if self.status != "completed":
            if self.status in ("interrupted", "budget_exhausted"):
                return self.status  # type: ignore[return-value]
            return "failed"
        errors, rollouts = self.summary.error_count, self.summary.rollouts
        if errors and (errors == rollouts or errors > max_error_rate * rollouts):
            return "completed_with_errors"
        return "completed"

    def exit_code(self, max_error_rate: float = DEFAULT_MAX_ERROR_RATE) -> int:
        """The process exit status that says :meth:`outcome` (0 only when it completed).
        An interruption by a signal exits 128 + the signal's number instead (the CLI)."""
        return EXIT_CODES[self.outcome(max_error_rate)]

    def problem(self, max_error_rate: float = DEFAULT_MAX_ERROR_RATE) -> str | None:
        """One line saying what went wrong and what to do; ``None`` when it completed."""
        outcome = self.outcome(max_error_rate)
        label = self.run_id or self.run_dir
        if outcome == "completed":
            return None
        if outcome == "completed_with_errors":
            summary = self.summary
            kinds = ", ".join(f"{kind}: {n}" for kind, n in summary.errors.most_common(3))
            return (
                f"completed with errors: {summary.error_count} of {summary.rollouts} rollouts "
                f"errored ({kinds}); see each kind's message above, fix the endpoint or raise "
                "--max-retries and rerun, or accept a share of errors with --max-error-rate"
            )
        return self.error or f"eval run {label} ended {self.status}"

    def raise_for_status(self, max_error_rate: float | None = None) -> None:
        """Raise :class:`VfopsError` unless the run completed (and, when
        ``max_error_rate`` is given, unless its errors stay within it: by default a
        run with errored rollouts is a result, which :meth:`outcome` describes)."""
        if max_error_rate is None and self.status == "completed":
            return
        problem = self.problem(DEFAULT_MAX_ERROR_RATE if max_error_rate is None else max_error_rate)
        if problem is not None:
            error = VfopsError(problem)
            error.exit_code = self.exit_code(
                DEFAULT_MAX_ERROR_RATE if max_error_rate is None else max_error_rate
            )
            raise error


@dataclass(frozen=True)
class OpenedRun:
    """What is known once a run is open (handed to :meth:`EvalProgress.opened`)."""

    run_id: str | None
    run_dir: Path
    action: Action
    planned: int
    """Rollouts the run will hold when complete."""
    done: int
    """Rollouts it already holds."""


class EvalProgress(Protocol):
    """Hooks for a progress display (the CLI's bar, a flow's log)."""

    def opened(self, run: OpenedRun) -> None: ...

    def group(self, records: list[RolloutRecord], summary: EvalSummary) -> None: ...


@dataclass
class _Plan:
    """An opened run: identity, where it lives, what is already done."""

    request: EvalRequest
    run_dir: Path
    action: Action
    run_id: str | None = None
    provenance: Provenance | None = None
    done_in_registry: set[tuple[int, int]] = field(default_factory=set)
    resume_folder: bool = False
    lease: LeaseOwner | None = None
    """This evaluation's lease on the registry run (set once the run is open)."""


async def evaluate_async(
    request: EvalRequest,
    *,
    model_options: ModelOptions | None = None,
    output_root: Path | None = None,
    resume: str | None = None,
    existing: Existing = "new",
    registry: bool = True,
    tracking: bool | None = None,
    engine: Engine | None = None,
    mlflow_parent_run_id: str | None = None,
    environment: Environment | None = None,
    client: ModelClient | None = None,
    progress: EvalProgress | None = None,
    max_cost: float | None = None,
    cost_caps: Mapping[str, float | None] | None = None,
) -> EvalResult:
    """Run (or resume, or reuse) an evaluation; see the module docstring.

    ``max_cost`` caps the run's spend in USD (its own ledger scope ``run:<id>``, so a
    resume with a higher cap continues it); ``cost_caps`` are further scopes the run
    spends against, shared with other runs (a sweep's ``sweep:<name>``: ``None``
    records the spend without a cap). Each priced request reserves its worst-case
    cost on every scope first; a run that finds no room stops with status
    ``budget_exhausted`` (needs the registry and a priced endpoint).

    ``tracking`` (default: on unless ``VFOPS_TRACKING=0``) needs the registry: the
    MLflow run is recorded while the rollouts run, and this returns once MLflow has
    everything (metrics, rollouts, traces) and the registry run links it.
    ``environment`` and ``client`` replace the loaded environment and the client
    built from ``request.model`` (the caller keeps and closes them; the run then
    records ``request.model`` and ``model_options.base_url`` as given).
    """
    request = dataclasses.replace(request, tags=list(request.tags))
    request.validate()
    _check_caps(max_cost, cost_caps, registry=registry)
    options = model_options or ModelOptions()
    options.validate()
    output_root = output_root or DEFAULT_OUTPUT_ROOT
    scoring_timeout_s()  # a bad VFOPS_SCORING_TIMEOUT_S is one line, before any run
    if registry:
        registry_retry_s()  # a bad VFOPS_REGISTRY_RETRY_S is one line, before any run
    if resume is None:  # a new run's folder goes there: checked before it is recorded
        fix = "pass a folder with -o/--output"
        check_writable_folder(output_root, what="output folder", fix=fix)
    if resume is not None and not registry:
        read_metadata(Path(resume))  # a clear one-line error on a wrong folder, now
    track = registry and _tracking_on(tracking)
    # first: MLflow's start-up in the tracker overlaps everything below
    tracker = _start_tracker(request.env_name) if track else None
    env = environment
    connection_client: ModelClient | None = None
    # A new run is opened in the registry while its first rollouts run (importing the
    # registry and opening the run would otherwise come first); resuming or reusing
    # needs the registry's answer before anything is generated.
    open_in_background = registry and resume is None and existing == "new"
    capped = max_cost is not None or bool(cost_caps)
    calls: RegistryCalls | None = None
    try:
        if registry:
            # first, so that the registry process's imports overlap everything below
            calls = await _registry_calls(engine, tracker)
        if env is None:
            from vfops.envs import load_environment

            env = load_environment(request.env_name, **request.env_args)
        # recorded as what runs: -1 (all) and an N above the dataset's size are its size
        request.num_examples = _examples_to_run(env, request)
        planned = request.num_examples * request.rollouts_per_example
        if client is None:
            connection = await connect_model(request.model, options)
            client = connection_client = connection.client
            request.model, request.base_url = connection.model, connection.base_url
        else:
            request.base_url = request.base_url or options.base_url
        if capped:
            _check_priced(client, request.model)
        if track:
            await asyncio.to_thread(_check_tracking_server)
        opening: asyncio.Task[RegistryCalls] | None = None
        if open_in_background:
            assert calls is not None
            plan, opening = _open_in_background(request, calls, output_root)
        else:
            plan = await _open(request, calls, output_root, resume, existing)
        if plan.action == "reused":
            assert calls is not None and plan.run_id is not None
            return await _reused_result(calls, plan)
        ledger = None
        if capped:
            assert calls is not None and plan.run_id is not None
            ledger = await _open_ledger(calls, plan.run_id, max_cost, cost_caps or {})
        async with _peers(client, calls):
            context = _RunContext(
                planned=planned,
                registry=None if opening is not None else calls,
                opening=opening,
                tracker=tracker,
                mlflow_parent_run_id=mlflow_parent_run_id,
                progress=progress,
                ledger=ledger,
            )
            return await _run(env, client, plan, context)
    finally:
        if connection_client is not None:
            await connection_client.aclose()
        if environment is None and env is not None:
            await env.aclose()
        # the calls first: served by the tracker process (vfops eval), they end before
        # it can exit
        if calls is not None:
            await calls.aclose()
        if tracker is not None:
            await tracker.aclose()


@contextlib.asynccontextmanager
async def _peers(client: ModelClient, calls: RegistryCalls | None) -> AsyncIterator[None]:
    """While the run runs, its adaptive limiter shares pushbacks with other processes
    using the endpoint, through the registry (:class:`vfops.budget.PeerSync`)."""
    limiter = getattr(client, "limiter", None)
    if calls is None or not isinstance(limiter, AdaptiveLimiter) or not limiter.name:
        yield
        return
    from vfops.budget import peer_sync

    async with peer_sync(limiter, calls):
        yield


def _check_caps(
    max_cost: float | None, cost_caps: Mapping[str, float | None] | None, *, registry: bool
) -> None:
    caps = {"max_cost": max_cost, **{f"cost cap {k!r}": v for k, v in (cost_caps or {}).items()}}
    for name, cap in caps.items():
        if cap is not None and not (math.isfinite(cap) and cap > 0):
            raise VfopsError(f"{name} must be a positive number of USD, got {cap}; e.g. 5.0")
    if (max_cost is not None or cost_caps) and not registry:
        raise VfopsError(
            "a cost cap needs the registry (its ledger is shared by every process); "
            "drop --no-registry or the cap"
        )


def _check_priced(client: ModelClient, model: str) -> None:
    if getattr(client, "pricing", None) is None:
        raise VfopsError(
            f"a cost cap needs prices for model {model!r}: set input_price_per_mtok and "
            "output_price_per_mtok (USD per million tokens) on its [[endpoint]] in "
            "endpoints.toml, or drop the cap"
        )


async def _open_ledger(
    calls: RegistryCalls,
    run_id: str,
    max_cost: float | None,
    cost_caps: Mapping[str, float | None],
) -> RegistryLedger:
    caps = {**cost_caps, run_scope(run_id): max_cost}
    await calls.call(set_caps, caps, run_id)
    return RegistryLedger(calls, list(caps), run_id)


def run_scope(run_id: str) -> str:
    """The ledger scope of one run's own cap (``vfops eval --max-cost``)."""
    return f"run:{run_id}"


async def _registry_calls(engine: Engine | None, tracker: Tracker | None) -> RegistryCalls:
    """The caller's engine in a worker thread, else the default registry in the tracker
    process when it serves it (``vfops eval`` starts it so), else in a child process of
    its own (see :mod:`vfops.evaluation._registry_calls`)."""
    from vfops.evaluation._registry_calls import ChildCalls, ThreadCalls

    if engine is not None:
        return ThreadCalls(engine)
    channel = tracker.take_side_channel() if tracker is not None else None
    return await ChildCalls.over(channel) if channel is not None else await ChildCalls.start()


def _tracking_on(tracking: bool | None) -> bool:
    from vfops.tracking import tracking_enabled

    return tracking_enabled() if tracking is None else tracking and tracking_enabled()


def _start_tracker(env_name: str) -> Tracker:
    from vfops.tracking import Tracker

    return Tracker.for_run(env_name=env_name)


def _check_tracking_server() -> None:
    """A tracking server that does not answer, or an SQLite store whose folder cannot
    be written, fails now, before a run is recorded (MLflow itself is not imported:
    the tracker process does that)."""
    from vfops.tracking import check_sqlite_store, check_tracking, is_embedded, tracking_uri

    uri = tracking_uri()
    if not is_embedded() and uri.startswith(("http://", "https://")):
        check_tracking()
    else:
        check_sqlite_store(uri)


def _examples_to_run(env: Environment, request: EvalRequest) -> int:
    # eval_size, not len(env.eval_dataset): plain rows stay plain (no datasets import).
    size = env.eval_size()
    if size is None:
        raise VfopsError(f"environment '{request.env_name}' has no dataset to evaluate")
    if size == 0:
        raise VfopsError(
            f"environment '{request.env_name}' has an empty eval dataset; check --env-args"
        )
    return size if request.num_examples < 0 else min(request.num_examples, size)


# ------------------------------------------------------------------ opening a run


async def _open(
    request: EvalRequest,
    registry: RegistryCalls | None,
    output_root: Path,
    resume: str | None,
    existing: Existing,
) -> _Plan:
    if registry is None:
        if resume is not None:
            run_dir = Path(resume)
            return _Plan(request, run_dir, "resumed", resume_folder=True)
        return _Plan(request, new_run_dir(output_root, request.env_name, request.model), "created")
    installed = await asyncio.to_thread(_inspect_installed, request.env_name)
    return await registry.call(
        _open_registry_run,
        request,
        output_root,
        resume,
        existing,
        pid=os.getpid(),
        installed=installed,
    )


def _open_in_background(
    request: EvalRequest, registry: RegistryCalls, output_root: Path
) -> tuple[_Plan, asyncio.Task[RegistryCalls]]:
    """A new run's identity now (its id is generated here), and a task that records
    the run in the registry meanwhile."""
    run_id = uuid.uuid4().hex
    run_dir = new_run_dir(output_root, request.env_name, request.model, run_id)
    plan = _Plan(request, run_dir, "created", run_id=run_id)

    async def open_run() -> RegistryCalls:
        installed = await asyncio.to_thread(_inspect_installed, request.env_name)
        opened = await registry.call(
            _open_registry_run,
            request,
            output_root,
            None,
            "new",
            new_run=(run_id, run_dir),
            pid=os.getpid(),
            installed=installed,
        )
        # the registry may have worked on a copy (another process): take what it found
        plan.provenance, plan.lease = opened.provenance, opened.lease
        request.env_version = opened.request.env_version
        return registry

    return plan, asyncio.create_task(open_run())


def _open_registry_run(
    engine: Engine,
    request: EvalRequest,
    output_root: Path,
    resume: str | None,
    existing: Existing,
    *,
    new_run: tuple[str, Path] | None = None,
    pid: int | None = None,
    installed: InstalledEnvironment | None = None,
) -> _Plan:
    """Open ``request``'s run in the registry; ``new_run``: the id and folder of a run
    to create (generated by the caller); ``pid``: the evaluating process, whose lease
    this is (default: this process); ``installed``: the environment's installed code,
    inspected by the evaluating process (an environment it registered at run time is
    not visible to the registry's process)."""
    from vfops.evaluation._provenance import config_fingerprint, resolve_provenance
    from vfops.registry import (
        LeaseOwner,
        completed_keys,
        create_run,
        find_completed_run,
        find_resumable_run,
        get_run,
        session_scope,
        set_run_status,
        take_run_lease,
    )

    provenance = resolve_provenance(engine, request.env_name, installed)
    request.env_version = provenance.version
    # this evaluation's, on whichever run it works
    lease = LeaseOwner.for_process(os.getpid() if pid is None else pid)
    fingerprint = config_fingerprint(request, provenance)
    with session_scope(engine) as session:
        found = None
        if resume is not None:
            run_id = _run_id_of(resume)
            found = get_run(session, run_id)
            if found is None and Path(resume).is_dir():
                # killed before the run was recorded (it is opened while the first
                # rollouts run): record it now, its folder holds what was done
                new_run = (run_id, Path(resume))
            elif found is None:
                raise VfopsError(
                    f"no eval run {resume!r} in the registry; see: vfops runs list (a run "
                    "stopped before it was recorded resumes from its folder: --resume RUN_DIR)"
                )
            if found is not None and found.config_fingerprint != fingerprint:
                raise VfopsError(
                    f"cannot resume run {found.id}: its environment version, model or settings "
                    f"differ from this command ({found.environment_name}@"
                    f"{found.environment_version}, model {found.model}); rerun with the same ones"
                )
        elif existing != "new":
            found = find_resumable_run(session, fingerprint)
            if found is None and existing == "reuse":
                found = find_completed_run(session, fingerprint)
                if found is not None:
                    return _Plan(
                        request,
                        Path(found.output_dir or output_root),
                        "reused",
                        run_id=found.id,
                        provenance=provenance,
                    )
        if found is None:
            run = create_run(
                session,
                environment_name=request.env_name,
                environment_version=provenance.version,
                environment_content_hash=provenance.code_hash,
                environment_version_id=provenance.version_id,
                model=request.model,
                base_url=request.base_url,
                sampling_args=request.sampling_args,
                env_args=request.env_args,
                num_examples=request.num_examples,
                rollouts_per_example=request.rollouts_per_example,
                config_fingerprint=fingerprint,
                tags=[*request.tags, *_library_tags(provenance)],
                run_id=new_run[0] if new_run else None,
                lease_owner=lease,
            )
            run_dir = (
                new_run[1]
                if new_run
                else new_run_dir(output_root, request.env_name, request.model, run.id)
            )
            run.output_dir = str(run_dir)
            if resume is not None:  # recorded late: resumed from its folder
                return _Plan(
                    request, run_dir, "resumed", run_id=run.id, provenance=provenance,
                    resume_folder=True, lease=lease,
                )  # fmt: skip
            return _Plan(
                request, run_dir, "created", run_id=run.id, provenance=provenance, lease=lease
            )
        # one process per run: refused here (naming the holder) before anything changes
        take_run_lease(session, found.id, lease)
        set_run_status(session, found.id, "running")
        if resume is not None and Path(resume).is_dir():
            # the folder given, wherever it is now (moved off a full disk, another host's
            # copy): the run's files are there from now on
            run_dir = Path(resume)
            found.output_dir = str(run_dir)
        else:
            run_dir = Path(found.output_dir) if found.output_dir else Path(resume or output_root)
        run_id = found.id
    return _Plan(
        request,
        run_dir,
        "resumed",
        run_id=run_id,
        provenance=provenance,
        done_in_registry=completed_keys(engine, run_id),
        resume_folder=(run_dir / "metadata.json").exists(),
        lease=lease,
    )


def _inspect_installed(env_name: str) -> InstalledEnvironment:
    from vfops.publishing._provenance import inspect_installed

    return inspect_installed(env_name)


def _run_id_of(resume: str) -> str:
    path = Path(resume)
    if path.is_dir():
        run_id = read_metadata(path).get("run_id")
        if not run_id:
            raise VfopsError(f"{path} was not recorded in the registry (no run_id in metadata)")
        return str(run_id)
    return resume


async def _reused_result(registry: RegistryCalls, plan: _Plan) -> EvalResult:
    assert plan.run_id is not None
    summary = await registry.call(registry_summary, plan.run_id, plan.request.pass_threshold)
    return EvalResult(
        run_dir=plan.run_dir,
        summary=summary,
        status="completed",
        metadata={**plan.request.identity(), "run_id": plan.run_id, "status": "completed"},
        run_id=plan.run_id,
        action="reused",
        mlflow_run_id=await registry.call(_mlflow_run_id_of, plan.run_id),
    )


def _mlflow_run_id_of(engine: Engine, run_id: str) -> str | None:
    from vfops.registry import get_run, session_scope

    with session_scope(engine, write=False) as session:
        row = get_run(session, run_id)
        return None if row is None else row.mlflow_run_id


def registry_summary(engine: Engine, run_id: str, pass_threshold: float = 1.0) -> EvalSummary:
    """Statistics of every rollout of a run stored in the registry."""
    from vfops.registry import iter_rollouts

    summary = EvalSummary(pass_threshold=pass_threshold)
    for record in iter_rollouts(engine, run_id):
        summary.add(record, new=False)
    return summary


# ------------------------------------------------------------------ running it


@dataclass
class _RunContext:
    """What running an opened run needs besides the environment, client and plan."""

    planned: int
    registry: RegistryCalls | None
    """The registry, when the run was opened before running (else ``opening``)."""
    opening: asyncio.Task[RegistryCalls] | None
    """A new run being recorded in the registry while its first rollouts run."""
    tracker: Tracker | None
    mlflow_parent_run_id: str | None
    progress: EvalProgress | None
    ledger: RegistryLedger | None = None


async def _run(
    env: Environment, client: ModelClient, plan: _Plan, context: _RunContext
) -> EvalResult:
    registry = context.registry
    request, run_dir = plan.request, plan.run_dir
    metadata = initial_metadata(request, type(env).__name__)
    if plan.run_id is not None:
        metadata["run_id"] = plan.run_id
        _add_provenance(metadata, plan)
    folder_lock = RunFolderLock(run_dir)
    try:
        if plan.resume_folder:
            metadata = check_resumable(run_dir, request, metadata)
        folder_lock.acquire()  # before anything in the folder is written
    except (VfopsError, OSError):
        # refused before anything ran: the run is free again for a corrected command
        if registry is not None and plan.run_id is not None and plan.lease is not None:
            # best effort: an unreleased lease expires anyway; the refusal is the news
            with contextlib.suppress(Exception):
                await registry.call(_release_lease, plan.run_id, plan.lease)
        raise
    try:
        return await _run_locked(env, client, plan, metadata, context)
    finally:
        folder_lock.release()


def _release_lease(engine: Engine, run_id: str, lease: LeaseOwner) -> None:
    from vfops.registry import release_run_lease, session_scope

    with session_scope(engine) as session:
        release_run_lease(session, run_id, lease)


async def _run_locked(
    env: Environment,
    client: ModelClient,
    plan: _Plan,
    metadata: dict[str, Any],
    context: _RunContext,
) -> EvalResult:
    request, run_dir = plan.request, plan.run_dir
    writer = RolloutWriter(run_dir)
    sinks: list[Sink] = []
    summary = EvalSummary(pass_threshold=request.pass_threshold)
    registry_source = context.opening or context.registry
    tracking_sink: TrackingSink | None = None
    if registry_source is not None and plan.run_id is not None:
        registry_sink = RegistrySink(registry_source, plan.run_id, lease=lambda: plan.lease)
        registry_sink.start()  # renews the run's lease from now on, however slow the rollouts
        sinks.append(registry_sink)
        if context.tracker is not None:
            # recorded while it runs; closed after the registry has the run's end. The
            # tracker reads every rollout from results.jsonl, so it writes the Arrow
            # export too (rebuilt whole on --resume: it reads the file from its start)
            tracking_sink = TrackingSink(
                context.tracker,
                registry_source,
                plan.run_id,
                results=lambda: writer.size,
                results_path=writer.path,
                summary=summary,
                parent_run_id=context.mlflow_parent_run_id,
                export=run_dir / ARROW_FILE,
            )
            tracking_sink.start()
            sinks.append(TrackerExportSink(tracking_sink))
    if tracking_sink is None:
        sinks.insert(0, ArrowSink(run_dir, resume=plan.run_id or run_dir))
    done: set[tuple[int, int]] = set()
    status, error = "interrupted", None
    in_delivery: set[asyncio.Future[None]] = set()
    started = time.perf_counter()
    progress = context.progress
    try:
        _to_folder(plan, write_metadata, run_dir, metadata)
        await _catch_up(run_dir, plan, sinks, summary, done)
        if plan.done_in_registry - done:
            # on the registry only (written by another worker, or lost from this folder):
            # copied here, so that the folder holds the whole run again
            await _copy_from_registry(plan, writer, sinks, summary, done, registry_source)
        if progress is not None:
            opened = OpenedRun(plan.run_id, run_dir, plan.action, context.planned, len(done))
            progress.opened(opened)

        async def to_sinks(records: list[RolloutRecord]) -> None:
            for sink in sinks:
                await sink.write_group(records)
            for record in records:
                summary.add(record)
            if tracking_sink is not None:
                await tracking_sink.write_group(records)
            if progress is not None:
                progress.group(records, summary)

        async def handle(records: list[RolloutRecord]) -> None:
            # first: what is on disk survives a crash; a group not wholly written (a full
            # disk) reaches no sink, so the registry never holds what the folder lacks
            _to_folder(plan, writer.write_group, records)
            # A group on disk reaches every sink even when the run is interrupted
            # meanwhile (SIGINT/SIGTERM): the registry then holds what the folder holds.
            delivering = asyncio.ensure_future(to_sinks(records))
            in_delivery.add(delivering)
            delivering.add_done_callback(in_delivery.discard)
            await asyncio.wait({delivering})
            delivering.result()

        with use_ledger(context.ledger):
            await run_rollouts(env, client, request, done, handle)
        status = "completed"
    except SinkError as exc:
        status, error = "failed", str(exc)
    except BudgetExhausted as exc:
        status, error = "budget_exhausted", _budget_hint(plan, exc, context.planned)
    except asyncio.CancelledError:
        status = "interrupted"
        raise
    except BaseException as exc:
        status, error = "failed", _resume_hint(plan, first_line(exc))
        raise
    finally:
        summary.wall_s = time.perf_counter() - started
        writer.close()

        async def settle() -> EvalResult:
            if in_delivery:  # an interrupted group's delivery ends before the sinks close
                delivering = set(in_delivery)
                await asyncio.wait(delivering)
                for late in delivering:  # a sink's failure is raised again by its close
                    _ = late.cancelled() or late.exception()
            opened = context.registry if context.opening is None else await _opened(context.opening)
            _add_provenance(metadata, plan)
            return await _finish(
                plan,
                sinks,
                tracking_sink,
                summary,
                metadata,
                status,
                error,
                registry=opened,
            )

        result = await _settled(settle())
    return result


async def _settled(settle: Coroutine[Any, Any, EvalResult]) -> EvalResult:
    """Record the run's end however often this task is cancelled meanwhile (a second
    Ctrl-C, SIGTERM after SIGINT): it is never left ``running`` with rows missing. A
    cancellation that came while a run that was not interrupted ended is dropped: the
    run finished, and its result says how."""
    settling = asyncio.ensure_future(settle)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(settling)
            break
        except asyncio.CancelledError:
            if settling.done() and settling.cancelled():
                raise
            cancelled = True
    task = asyncio.current_task()
    if cancelled and task is not None:
        task.uncancel()
        if result.status == "interrupted":
            raise asyncio.CancelledError
    return result


async def _opened(opening: asyncio.Task[RegistryCalls]) -> RegistryCalls | None:
    """The registry of a run opened in the background, or None when opening it failed
    (the registry sink, which waited for the same task, reports why)."""
    await asyncio.wait({opening})
    return None if opening.cancelled() or opening.exception() is not None else opening.result()


def _add_provenance(metadata: dict[str, Any], plan: _Plan) -> None:
    if plan.provenance is not None:
        metadata.update(
            env_version=plan.provenance.version, env_code_hash=plan.provenance.code_hash
        )
        if plan.provenance.library_label is not None:
            metadata["env_library"] = plan.provenance.library_label


def _library_tags(provenance: Provenance) -> list[str]:
    """A run of an environment written for another library carries that library's
    version among its tags (``verifiers==0.3.1``)."""
    label = provenance.library_label
    return [label] if label is not None else []


def _budget_hint(plan: _Plan, exc: BudgetExhausted, planned: int) -> str:
    label = plan.run_id or plan.run_dir
    return (
        f"{exc}; the run {label} stopped (planned {planned} rollouts); continue it with "
        f"vfops eval ... --resume {label} and a higher --max-cost (or none)"
    )


def _resume_hint(plan: _Plan, problem: str) -> str:
    label = plan.run_id or plan.run_dir
    return f"{problem}; fix it, then finish the run with vfops eval ... --resume {label}"


async def _catch_up(
    run_dir: Path,
    plan: _Plan,
    sinks: Sequence[Sink],
    summary: EvalSummary,
    done: set[tuple[int, int]],
) -> None:
    """Resume: count the records on disk and send them on to the sinks.

    The Arrow export is rebuilt from all of them; the registry gets those it
    misses (a crash between the two writes), so nothing completed is regenerated.
    """
    if not plan.resume_folder:
        return
    batch: list[RolloutRecord] = []
    for record in iter_records(run_dir):
        if record.key in done:
            continue
        done.add(record.key)
        summary.add(record, new=False)
        batch.append(record)
        if len(batch) >= _CATCH_UP_BATCH:
            await _send_caught_up(sinks, batch, plan.done_in_registry)
            batch = []
    await _send_caught_up(sinks, batch, plan.done_in_registry)


async def _send_caught_up(
    sinks: Sequence[Sink], records: list[RolloutRecord], in_registry: set[tuple[int, int]]
) -> None:
    if not records:
        return
    for sink in sinks:
        if isinstance(sink, RegistrySink):
            missing = [r for r in records if r.key not in in_registry]
            if missing:
                await sink.write_group(missing)
        else:
            await sink.write_group(records)


async def _copy_from_registry(
    plan: _Plan,
    writer: RolloutWriter,
    sinks: Sequence[Sink],
    summary: EvalSummary,
    done: set[tuple[int, int]],
    registry: RegistryCalls | asyncio.Future[RegistryCalls] | None,
) -> None:
    """Resume: write the rollouts the registry holds and this folder lacks into the
    folder (and the export), so that nothing completed is regenerated and the folder
    holds the whole run."""
    assert registry is not None and plan.run_id is not None
    calls = registry if not isinstance(registry, asyncio.Future) else await registry
    # one pass over the run's rows in the registry (each call would stream them all)
    found = await calls.call(_registry_records, plan.run_id, plan.done_in_registry - done)
    for start in range(0, len(found), _CATCH_UP_BATCH):
        records = found[start : start + _CATCH_UP_BATCH]
        _to_folder(plan, writer.write_group, records)
        for sink in sinks:
            if not isinstance(sink, RegistrySink):
                await sink.write_group(records)
        for record in records:
            done.add(record.key)
            summary.add(record, new=False)


def _to_folder(plan: _Plan, write: Callable[..., None], *args: Any) -> None:
    """``write(*args)`` into the run folder; a folder that cannot take it (a full disk)
    fails the run as a sink does, with how to finish it elsewhere."""
    try:
        write(*args)
    except DiskWriteError as exc:
        label = plan.run_id or plan.run_dir
        raise SinkError(
            "run folder",
            str(exc),
            f"free space there and finish the run with vfops eval ... --resume {label} "
            f"(or move the folder {plan.run_dir} elsewhere and pass its new path to --resume)",
        ) from exc


def _registry_records(
    engine: Engine, run_id: str, keys: set[tuple[int, int]]
) -> list[RolloutRecord]:
    from vfops.registry import iter_rollouts

    return [record for record in iter_rollouts(engine, run_id) if record.key in keys]


async def _finish(
    plan: _Plan,
    sinks: Sequence[Sink],
    tracking_sink: TrackingSink | None,
    summary: EvalSummary,
    metadata: dict[str, Any],
    status: str,
    error: str | None,
    *,
    registry: RegistryCalls | None,
) -> EvalResult:
    """Close every sink (each failure recorded, none swallowed), then record the end: in
    the registry, in MLflow (waiting until it has everything), in ``metadata.json``."""
    finish = RunFinish(status=status, summary=summary, error=error)
    for sink in sinks:
        try:
            await sink.close(finish)
        except SinkError as exc:
            finish.status, finish.error = "failed", finish.error or str(exc)
        except Exception as exc:
            problem = f"{sink.name}: {first_line(exc)}"
            finish.status, finish.error = "failed", finish.error or _resume_hint(plan, problem)
    registry_sink = next((s for s in sinks if isinstance(s, RegistrySink)), None)
    recorded = registry is not None and plan.run_id is not None
    # the folder first: one that cannot say how the run ended (a full disk) fails it
    # before the registry and MLflow record it as anything else
    _end_metadata(plan, metadata, finish)
    if recorded:
        assert registry is not None and plan.run_id is not None
        await _record_end(registry, plan.run_id, finish, summary, plan.lease, registry_sink)
    mlflow_run_id = None
    if tracking_sink is not None and recorded:
        assert registry is not None and plan.run_id is not None
        if finish.status == "completed":
            finish.extra["rollouts_file"] = str(plan.run_dir / ARROW_FILE)
        try:
            await tracking_sink.close(finish)
            mlflow_run_id = tracking_sink.mlflow_run_id
        except SinkError as exc:
            if finish.status == "completed":  # else the first problem stays the news
                finish.status, finish.error = "failed", str(exc)
                await _record_end(registry, plan.run_id, finish, summary)
    if mlflow_run_id is not None or finish.status != metadata["status"]:
        if mlflow_run_id is not None:
            metadata["mlflow_run_id"] = mlflow_run_id
        status_before = finish.status
        _end_metadata(plan, metadata, finish)
        if finish.status != status_before and recorded:
            assert registry is not None and plan.run_id is not None
            await _record_end(registry, plan.run_id, finish, summary)
    return EvalResult(
        run_dir=plan.run_dir,
        summary=summary,
        status=finish.status,
        metadata=metadata,
        run_id=plan.run_id,
        action=plan.action,
        mlflow_run_id=mlflow_run_id,
        error=finish.error,
    )


def _end_metadata(plan: _Plan, metadata: dict[str, Any], finish: RunFinish) -> None:
    """``metadata.json`` with the run's end; a folder that cannot take it fails the run."""
    metadata.update(
        status=finish.status,
        finished_at=now_iso(),
        summary=finish.summary.to_dict(),
        error=finish.error,
    )
    try:
        write_metadata(plan.run_dir, metadata)
    except DiskWriteError as exc:
        finish.status = metadata["status"] = "failed"
        finish.error = finish.error or (
            f"run folder: {exc}; free space there, then finish the run with vfops eval ... "
            f"--resume {plan.run_id or plan.run_dir}"
        )


async def _record_end(
    registry: RegistryCalls,
    run_id: str,
    finish: RunFinish,
    summary: EvalSummary,
    lease: LeaseOwner | None = None,
    registry_sink: RegistrySink | None = None,
) -> None:
    """Record the end in the registry (retried while the database does not answer,
    unless the run failed because it did not: then once)."""
    stored = summary.to_dict()
    if finish.error:
        stored["error"] = finish.error
    args = (run_id, finish.status, stored, lease)
    try:
        if registry_sink is not None and not registry_sink.gave_up:
            await registry_sink.retrying(registry, _write_end, *args)
        else:
            await registry.call(_write_end, *args)
    except Exception as exc:
        # The registry itself is down: the folder says failed; --resume fixes both.
        finish.status = "failed"
        finish.error = finish.error or (
            f"registry: could not record the end of run {run_id} ({first_line(exc)}); "
            f"fix the database, then finish the run with vfops eval ... --resume {run_id}"
        )


def _write_end(
    engine: Engine, run_id: str, status: str, stored: dict[str, Any], lease: LeaseOwner | None
) -> None:
    """The run's end and, with its ``lease``, the run free for the next process at once."""
    from vfops.registry import finish_run, release_run_lease, session_scope

    with session_scope(engine) as session:
        finish_run(session, run_id, status, stored)
        if lease is not None:
            release_run_lease(session, run_id, lease)


evaluate = blocking_twin(evaluate_async)
"""Synchronous :func:`evaluate_async` (same arguments)."""
