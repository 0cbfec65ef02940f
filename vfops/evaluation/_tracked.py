"""Evaluation recorded in the registry: provenance, exactly-once rollouts, resume.

The run directory's JSONL stays the first write (flushed per group); rollouts
then go to the registry in batches from a background writer. A crash loses only
what was in flight: on ``--resume`` rollouts found on disk but not in the
registry are sent on, and only missing (example_id, rollout_index) pairs are
generated. The unique key plus insert-on-conflict makes every write idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from vfops._errors import VfopsError
from vfops._rollout import RolloutRecord
from vfops.clients._base import ModelClient
from vfops.envs._environment import Environment
from vfops.evaluation._runner import (
    EvalRequest,
    EvalResult,
    GroupCallback,
    new_run_dir,
    run_eval_async,
)
from vfops.evaluation._store import read_metadata

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


@dataclass(frozen=True)
class Provenance:
    """Exactly which code ran: a published version, or ``local+<hash>``."""

    env_name: str
    version: str
    code_hash: str
    version_id: int | None

    @property
    def published(self) -> bool:
        return self.version_id is not None


def resolve_provenance(engine: Engine, env_name: str) -> Provenance:
    """Match the installed code of ``env_name`` against the published versions."""
    from sqlalchemy.orm import Session

    from vfops.publishing._provenance import inspect_installed
    from vfops.registry import find_version

    installed = inspect_installed(env_name)
    with Session(engine) as session:
        row = find_version(session, installed.env_name, code_hash=installed.code_hash)
        if row is not None:
            return Provenance(installed.env_name, row.version, installed.code_hash, row.id)
    return Provenance(installed.env_name, installed.local_label, installed.code_hash, None)


def config_fingerprint(request: EvalRequest, provenance: Provenance) -> str:
    """Hash of everything that changes what a run produces."""
    identity = {
        **request.identity(),
        "base_url": request.base_url,
        "env_version": provenance.version,
        "code_hash": provenance.code_hash,
    }
    return hashlib.sha256(orjson.dumps(identity, option=orjson.OPT_SORT_KEYS)).hexdigest()


class RegistrySink:
    """Batches scored groups into the registry from a background writer.

    ``write_group`` only appends to a buffer; a full buffer is queued for the
    writer, and a bounded queue applies backpressure if the database lags, so
    memory stays constant in the number of rollouts.
    """

    def __init__(
        self,
        engine: Engine,
        run_id: str,
        *,
        batch_rows: int = 512,
        flush_interval_s: float = 1.0,
        max_pending_batches: int = 4,
    ) -> None:
        self._engine = engine
        self._run_id = run_id
        self._batch_rows = batch_rows
        self._flush_interval_s = flush_interval_s
        self._buffer: list[RolloutRecord] = []
        self._queue: asyncio.Queue[list[RolloutRecord] | None] = asyncio.Queue(max_pending_batches)
        self._writer: asyncio.Task[None] | None = None
        self.inserted = 0

    async def write_group(self, records: list[RolloutRecord]) -> None:
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_loop())
        self._buffer.extend(records)
        if len(self._buffer) >= self._batch_rows:
            await self._queue.put(self._take())

    def _take(self) -> list[RolloutRecord]:
        batch, self._buffer = self._buffer, []
        return batch

    async def _write_loop(self) -> None:
        from vfops.registry import insert_rollouts

        while True:
            try:
                batch = await asyncio.wait_for(self._queue.get(), self._flush_interval_s)
            except TimeoutError:
                batch = self._take()  # a slow run still reaches the registry every second
            if batch is None:
                return
            if batch:
                self.inserted += await asyncio.to_thread(
                    insert_rollouts, self._engine, self._run_id, batch
                )

    async def aclose(self) -> None:
        """Flush everything buffered and stop the writer (also on cancellation)."""
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_loop())
        await self._queue.put(self._take())
        await self._queue.put(None)
        await self._writer


@dataclass(frozen=True)
class TrackedRun:
    run_id: str
    run_dir: Path
    provenance: Provenance


def open_run(
    engine: Engine,
    request: EvalRequest,
    *,
    output_root: Path,
    resume: str | None = None,
) -> TrackedRun:
    """Create a registry run, or reopen ``resume`` (a run id, id prefix or run folder)."""
    from vfops.registry import create_run, get_run, session_scope, set_run_status

    provenance = resolve_provenance(engine, request.env_name)
    request.env_version = provenance.version
    fingerprint = config_fingerprint(request, provenance)
    with session_scope(engine) as session:
        if resume is None:
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
                tags=request.tags,
            )
            run_dir = new_run_dir(output_root, request.env_name, request.model, run.id)
            run.output_dir = str(run_dir)
            return TrackedRun(run.id, run_dir, provenance)
        run_id = _run_id_of(resume)
        found = get_run(session, run_id)
        if found is None:
            raise VfopsError(f"no eval run {resume!r} in the registry; see: vfops runs list")
        if found.config_fingerprint != fingerprint:
            raise VfopsError(
                f"cannot resume run {found.id}: its environment version, model or settings "
                f"differ from this command ({found.environment_name}@"
                f"{found.environment_version}, model {found.model}); rerun with the same ones"
            )
        set_run_status(session, found.id, "running")
        run_dir = Path(found.output_dir) if found.output_dir else Path(resume)
        return TrackedRun(found.id, run_dir, provenance)


def _run_id_of(resume: str) -> str:
    path = Path(resume)
    if path.is_dir():
        run_id = read_metadata(path).get("run_id")
        if not run_id:
            raise VfopsError(f"{path} was not recorded in the registry (no run_id in metadata)")
        return str(run_id)
    return resume


async def run_tracked_eval_async(
    env: Environment,
    client: ModelClient,
    request: EvalRequest,
    *,
    output_root: Path,
    resume: str | None = None,
    on_group: GroupCallback | None = None,
    engine: Engine | None = None,
) -> tuple[TrackedRun, EvalResult]:
    """Run (or resume) an eval recorded in the registry; see the module docstring."""
    from vfops.registry import completed_keys, finish_run, get_engine, session_scope

    engine = engine or get_engine()
    tracked = open_run(engine, request, output_root=output_root, resume=resume)
    done = completed_keys(engine, tracked.run_id)
    sink = RegistrySink(engine, tracked.run_id)
    status = "interrupted"
    summary: dict[str, Any] = {}
    try:
        result = await run_eval_async(
            env,
            client,
            request,
            run_dir=tracked.run_dir,
            resume=resume is not None and tracked.run_dir.exists(),
            on_group=on_group,
            sinks=[sink],
            done=done,
            metadata_extra={
                "run_id": tracked.run_id,
                "env_version": tracked.provenance.version,
                "env_code_hash": tracked.provenance.code_hash,
            },
        )
        status, summary = result.status, result.metadata.get("summary", {})
    finally:
        with contextlib.suppress(Exception):
            await asyncio.shield(sink.aclose())
        if not summary and (tracked.run_dir / "metadata.json").exists():
            summary = read_metadata(tracked.run_dir).get("summary") or {}
        with session_scope(engine) as session:
            finish_run(session, tracked.run_id, status, summary)
    return tracked, result
