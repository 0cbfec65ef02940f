"""Opening a run: created, resumed or reused, in the registry and on disk, under a lease.

A run is opened before anything is generated (resuming or reusing needs the
registry's answer first) or, for a new run, while its first rollouts run
(:func:`open_in_background`: its id is generated here, the registry records it
meanwhile). Whoever opens a run takes its lease (one process per run, on any
machine: :func:`vfops.registry.take_run_lease`). The registry work runs through
:class:`~vfops.evaluation._registry_calls.RegistryCalls`, possibly in another
process: the functions it is handed are module-level, and return plain data.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vfops._errors import VfopsError
from vfops._plain_json import PLAIN_JSON, UnrecordableValueError, check_plain_json
from vfops.evaluation._registry_calls import RegistryUnavailable
from vfops.evaluation._result import Action, EvalResult, Existing
from vfops.evaluation._runner import EvalRequest, new_run_dir
from vfops.evaluation._store import read_metadata
from vfops.stats import EvalSummary

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

    from vfops._lease import LeaseOwner
    from vfops.evaluation._provenance import Provenance
    from vfops.evaluation._registry_calls import RegistryCalls
    from vfops.publishing import InstalledEnvironment
    from vfops.registry import EvalRunRow


@dataclass
class Plan:
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


@dataclass(frozen=True)
class _Opening:
    """What opening a run in the registry works from (one call, maybe in another process)."""

    request: EvalRequest
    output_root: Path
    resume: str | None
    existing: Existing
    provenance: Provenance
    lease: LeaseOwner
    fingerprint: str


async def open_run(
    request: EvalRequest,
    registry: RegistryCalls | None,
    output_root: Path,
    resume: str | None,
    existing: Existing,
) -> Plan:
    """Open the run now (the registry's answer first: resuming, reusing, no registry)."""
    if registry is None:
        if resume is not None:
            run_dir = Path(resume)
            return Plan(request, run_dir, "resumed", resume_folder=True)
        return Plan(request, new_run_dir(output_root, request.env_name, request.model), "created")
    installed = await asyncio.to_thread(_inspect_installed, request.env_name)
    try:
        with _named_unrecordable(request):
            return await registry.call(
                open_registry_run,
                request,
                output_root,
                resume,
                existing,
                pid=os.getpid(),
                installed=installed,
            )
    except RegistryUnavailable as exc:  # nothing was generated or changed yet
        again = f"vfops eval ... --resume {resume}" if resume is not None else "the evaluation"
        fix = f"bring it back (VFOPS_DATABASE_URL), then run {again} again"
        raise exc.with_fix(fix) from exc


def open_in_background(
    request: EvalRequest, registry: RegistryCalls, output_root: Path
) -> tuple[Plan, asyncio.Task[RegistryCalls]]:
    """A new run's identity now (its id is generated here), and a task that records
    the run in the registry meanwhile."""
    run_id = uuid.uuid4().hex
    run_dir = new_run_dir(output_root, request.env_name, request.model, run_id)
    plan = Plan(request, run_dir, "created", run_id=run_id)

    async def open_run() -> RegistryCalls:
        installed = await asyncio.to_thread(_inspect_installed, request.env_name)
        with _named_unrecordable(request):
            opened = await registry.call(
                open_registry_run,
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


@contextlib.contextmanager
def _named_unrecordable(request: EvalRequest) -> Iterator[None]:
    """A run that could not be recorded because a value of its arguments is not JSON
    (found when the request was checked, unless something changed the arguments after)
    fails as :class:`UnrecordableValueError` naming that value, never as a database
    fault."""
    try:
        yield
    except UnrecordableValueError:
        raise
    except Exception as exc:
        for name, flag, value in (
            ("env_args", "-a/--env-args", request.env_args),
            ("sampling_args", "-S/--sampling-args", request.sampling_args),
        ):
            try:
                check_plain_json(value, name, flag)
            except UnrecordableValueError as found:
                raise found from exc
        if _serialisation_error(exc):
            raise UnrecordableValueError(
                f"a value of the run's configuration cannot be recorded ({_first_line(exc)})",
                f"pass {PLAIN_JSON} in env_args (-a/--env-args) and sampling_args",
            ) from exc
        raise


def _serialisation_error(exc: BaseException) -> bool:
    # orjson's and json's words for a value they cannot write (the error may come back
    # from the registry's process as its text only)
    return "JSON serializable" in str(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def open_registry_run(
    engine: Engine,
    request: EvalRequest,
    output_root: Path,
    resume: str | None,
    existing: Existing,
    *,
    new_run: tuple[str, Path] | None = None,
    pid: int | None = None,
    installed: InstalledEnvironment | None = None,
) -> Plan:
    """Open ``request``'s run in the registry; ``new_run``: the id and folder of a run
    to create (generated by the caller); ``pid``: the evaluating process, whose lease
    this is (default: this process); ``installed``: the environment's installed code,
    inspected by the evaluating process (an environment it registered at run time is
    not visible to the registry's process)."""
    from vfops.evaluation._provenance import config_fingerprint, resolve_provenance
    from vfops.registry import LeaseOwner, completed_keys, session_scope

    provenance = resolve_provenance(engine, request.env_name, installed)
    request.env_version = provenance.version
    opening = _Opening(
        request,
        output_root,
        resume,
        existing,
        provenance,
        # this evaluation's, on whichever run it works
        LeaseOwner.for_process(os.getpid() if pid is None else pid),
        config_fingerprint(request, provenance),
    )
    with session_scope(engine) as session:
        found = None
        if resume is not None:
            found, new_run = _resumed(session, opening, new_run)
        elif existing != "new":
            found = _existing(session, opening)
            if found is not None and found.status == "completed":
                return Plan(
                    request,
                    Path(found.output_dir or output_root),
                    "reused",
                    run_id=found.id,
                    provenance=provenance,
                )
        if found is None:
            return _create(session, opening, new_run)
        run_dir = _take_over(session, opening, found)
        run_id = found.id
        done_in_registry = completed_keys(session, run_id)
    return Plan(
        request,
        run_dir,
        "resumed",
        run_id=run_id,
        provenance=provenance,
        done_in_registry=done_in_registry,
        resume_folder=(run_dir / "metadata.json").exists(),
        lease=opening.lease,
    )


def _resumed(
    session: Session, opening: _Opening, new_run: tuple[str, Path] | None
) -> tuple[EvalRunRow | None, tuple[str, Path] | None]:
    """The run ``--resume`` names (and, for one never recorded, the run to create)."""
    from vfops.registry import get_run

    resume = opening.resume
    assert resume is not None
    run_id = _run_id_of(resume)
    found = get_run(session, run_id)
    if found is None and Path(resume).is_dir():
        # killed before the run was recorded (it is opened while the first
        # rollouts run): record it now, its folder holds what was done
        return None, (run_id, Path(resume))
    if found is None:
        raise VfopsError(
            f"no eval run {resume!r} in the registry; see: vfops runs list (a run "
            "stopped before it was recorded resumes from its folder: --resume RUN_DIR)"
        )
    if found.config_fingerprint != opening.fingerprint:
        raise VfopsError(
            f"cannot resume run {found.id}: its environment version, model or settings "
            f"differ from this command ({found.environment_name}@"
            f"{found.environment_version}, model {found.model}); rerun with the same ones"
        )
    return found, new_run


def _existing(session: Session, opening: _Opening) -> EvalRunRow | None:
    """``existing="resume"``: the newest unfinished run with this fingerprint;
    ``"reuse"``: that, else the newest completed one."""
    from vfops.registry import find_completed_run, find_resumable_run

    found = find_resumable_run(session, opening.fingerprint)
    if found is None and opening.existing == "reuse":
        found = find_completed_run(session, opening.fingerprint)
    return found


def _create(session: Session, opening: _Opening, new_run: tuple[str, Path] | None) -> Plan:
    from vfops.registry import NewRun, create_run

    request, provenance = opening.request, opening.provenance
    run = create_run(
        session,
        NewRun(
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
            config_fingerprint=opening.fingerprint,
            tags=[*request.tags, *_library_tags(provenance)],
            run_id=new_run[0] if new_run else None,
            lease_owner=opening.lease,
        ),
    )
    if new_run:
        run_dir = new_run[1]
    else:
        run_dir = new_run_dir(opening.output_root, request.env_name, request.model, run.id)
    run.output_dir = str(run_dir)
    action: Action = "created" if opening.resume is None else "resumed"
    return Plan(
        request,
        run_dir,
        action,
        run_id=run.id,
        provenance=provenance,
        resume_folder=opening.resume is not None,  # recorded late: resumed from its folder
        lease=opening.lease,
    )


def _take_over(session: Session, opening: _Opening, found: EvalRunRow) -> Path:
    """Take the lease of a run to resume (refused, naming the holder, before anything
    changes: one process per run); the folder it continues in."""
    from vfops.registry import set_run_status, take_run_lease

    resume = opening.resume
    moved = resume is not None and Path(resume).is_dir()
    if moved:
        run_dir = Path(str(resume))
    elif found.output_dir:
        run_dir = Path(found.output_dir)
    else:
        run_dir = Path(resume or opening.output_root)
    take_run_lease(session, found.id, opening.lease)  # a live holder's: refused, named
    # in the same transaction: a refusal here rolls the takeover back
    _check_folder_free(run_dir)
    set_run_status(session, found.id, "running")
    if moved:
        # the folder given, wherever it is now (moved off a full disk, another host's
        # copy): the run's files are there from now on
        found.output_dir = str(run_dir)
    return run_dir


def _check_folder_free(run_dir: Path) -> None:
    """Refuse (:class:`RunFolderBusyError`, naming it) a run whose folder a live process
    still works in, within the transaction that takes its lease over (the refusal rolls
    it back): one paused past its lease (Ctrl-Z, SIGSTOP) keeps its folder's lock, and
    would otherwise lose the run to a resume that can only be refused."""
    from vfops.evaluation._lock import LOCK_FILE, RunFolderLock

    if (run_dir / LOCK_FILE).exists():
        probe = RunFolderLock(run_dir)
        probe.acquire()
        probe.release()


def _library_tags(provenance: Provenance) -> list[str]:
    """A run of an environment written for another library carries that library's
    version among its tags (``verifiers==0.3.1``)."""
    label = provenance.library_label
    return [label] if label is not None else []


def _inspect_installed(env_name: str) -> InstalledEnvironment:
    from vfops.publishing import inspect_installed

    return inspect_installed(env_name)


def _run_id_of(resume: str) -> str:
    path = Path(resume)
    if path.is_dir():
        run_id = read_metadata(path).get("run_id")
        if not run_id:
            raise VfopsError(f"{path} was not recorded in the registry (no run_id in metadata)")
        return str(run_id)
    return resume


async def reused_result(registry: RegistryCalls, plan: Plan) -> EvalResult:
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
    from vfops.registry import iter_rollouts, session_scope

    summary = EvalSummary(pass_threshold=pass_threshold)
    with session_scope(engine, write=False) as session:
        for record in iter_rollouts(session, run_id):
            summary.add(record, new=False)
    return summary
