"""Opening a run: created, resumed or reused, in the registry and on disk, under a lease.

A run is opened before anything is generated (resuming or reusing needs the
registry's answer first) or, for a new run, while its first rollouts run
(:func:`open_in_background`: its id is generated here, the registry records it
meanwhile). Whoever opens a run takes its lease (one process per run, on any
machine: :func:`vfops.registry.take_run_lease`). The registry's part is one call of
:meth:`vfops.registry.RunStore.open` (possibly in another process): this module turns
the request into a :class:`~vfops.registry.RunOpening` and the answer into a
:class:`Plan`.
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
from vfops.evaluation._result import Action, EvalResult, Existing
from vfops.evaluation._runner import EvalRequest, new_run_dir
from vfops.evaluation._store import read_metadata
from vfops.registry import RegistryUnavailable
from vfops.stats import EvalSummary

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from vfops._lease import LeaseOwner
    from vfops.evaluation._provenance import Provenance
    from vfops.publishing import InstalledEnvironment
    from vfops.registry import RunOpened, RunOpening, RunStore


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


async def open_run(
    request: EvalRequest,
    registry: RunStore | None,
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
    run_id = uuid.uuid4().hex
    opening = await _opening(request, output_root, run_id, existing, resume)
    try:
        with _named_unrecordable(request):
            opened = await registry.open(opening)
    except RegistryUnavailable as exc:  # nothing was generated or changed yet
        again = f"vfops eval ... --resume {resume}" if resume is not None else "the evaluation"
        fix = f"bring it back (VFOPS_DATABASE_URL), then run {again} again"
        raise exc.with_fix(fix) from exc
    plan = Plan(request, Path(opened.run_dir), opened.action, run_id=opened.run_id)
    _take(plan, opening, opened)
    return plan


def open_in_background(
    request: EvalRequest, registry: RunStore, output_root: Path
) -> tuple[Plan, asyncio.Task[RunStore]]:
    """A new run's identity now (its id is generated here), and a task that records
    the run in the registry meanwhile."""
    run_id = uuid.uuid4().hex
    run_dir = new_run_dir(output_root, request.env_name, request.model, run_id)
    plan = Plan(request, run_dir, "created", run_id=run_id)

    async def open_run() -> RunStore:
        opening = await _opening(request, output_root, run_id, "new", None, run_dir)
        with _named_unrecordable(request):
            _take(plan, opening, await registry.open(opening))
        return registry

    return plan, asyncio.create_task(open_run())


async def _opening(
    request: EvalRequest,
    output_root: Path,
    run_id: str,
    existing: Existing,
    resume: str | None,
    run_dir: Path | None = None,
) -> RunOpening:
    """What the registry opens ``request``'s run from. The installed code is inspected
    here: an environment this process registered at run time is not visible to the
    registry's process."""
    from vfops.registry import InstalledCode, RunOpening

    installed = await asyncio.to_thread(_inspect_installed, request.env_name)
    return RunOpening(
        code=InstalledCode(
            installed.env_name,
            installed.code_hash,
            installed.local_label,
            installed.library,
            installed.library_version,
        ),
        identity={**request.identity(), "base_url": request.base_url},
        model=request.model,
        base_url=request.base_url,
        sampling_args=request.sampling_args,
        env_args=request.env_args,
        num_examples=request.num_examples,
        rollouts_per_example=request.rollouts_per_example,
        tags=list(request.tags),
        run_id=run_id,
        run_dir=str(run_dir or new_run_dir(output_root, request.env_name, request.model, run_id)),
        output_root=str(output_root),
        pid=os.getpid(),
        existing=existing,
        resume=resume,
        resume_run_id=None if resume is None else _run_id_of(resume),
    )


def _take(plan: Plan, opening: RunOpening, opened: RunOpened) -> None:
    """``plan`` as the registry opened it: which code version ran, the lease, what the
    run holds already."""
    from vfops.evaluation._provenance import Provenance

    code = opening.code
    plan.provenance = Provenance(
        code.env_name,
        opened.version,
        code.code_hash,
        opened.version_id,
        library=code.library,
        library_version=code.library_version,
    )
    plan.request.env_version = opened.version
    plan.lease = opened.lease
    plan.done_in_registry = set(opened.done)
    plan.resume_folder = opened.resume_folder


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


async def reused_result(registry: RunStore, plan: Plan) -> EvalResult:
    assert plan.run_id is not None
    summary = await registry.summary(plan.run_id, plan.request.pass_threshold)
    record = await registry.record(plan.run_id)
    return EvalResult(
        run_dir=plan.run_dir,
        summary=summary,
        status="completed",
        metadata={**plan.request.identity(), "run_id": plan.run_id, "status": "completed"},
        run_id=plan.run_id,
        action="reused",
        mlflow_run_id=record["mlflow_run_id"],
    )


def registry_summary(engine: Engine, run_id: str, pass_threshold: float = 1.0) -> EvalSummary:
    """Statistics of every rollout of a run stored in the registry."""
    from vfops.registry import run_summary

    return run_summary(engine, run_id, pass_threshold)
