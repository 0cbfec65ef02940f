"""Run N examples x R rollouts with bounded concurrency, streaming results to disk.

Each example's R rollouts form a group: they are generated concurrently and
scored together as soon as the last one finishes, then written in one append.
At most ``max_concurrent`` rollouts are in flight; a bounded number of groups is
scheduled ahead so the limit stays saturated without holding the whole run in
memory.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from vfops._errors import VfopsError
from vfops._rollout import RolloutRecord
from vfops._types import SamplingArgs
from vfops._version import __version__
from vfops.clients._base import ModelClient
from vfops.envs._environment import Environment
from vfops.evaluation._store import (
    RolloutWriter,
    iter_records,
    read_metadata,
    write_dataset,
    write_metadata,
)
from vfops.evaluation._summary import EvalSummary

GroupCallback = Callable[[list[RolloutRecord], EvalSummary], None]


class RolloutSink(Protocol):
    """Somewhere else each scored group goes (the registry); may apply backpressure."""

    async def write_group(self, records: list[RolloutRecord]) -> None: ...


@dataclass
class EvalRequest:
    """What to run. Identity fields must match when a run is resumed."""

    env_name: str
    model: str
    num_examples: int = 5
    rollouts_per_example: int = 3
    max_concurrent: int = 32
    sampling_args: SamplingArgs = field(default_factory=dict)
    env_args: dict[str, Any] = field(default_factory=dict)
    base_url: str | None = None
    env_version: str | None = None
    pass_threshold: float = 1.0
    tags: list[str] = field(default_factory=list)
    """Which schedule made the run (e.g. ``nightly:2026-11-29``); part of its identity."""

    def identity(self) -> dict[str, Any]:
        return {
            "env_name": self.env_name,
            "env_args": self.env_args,
            "model": self.model,
            "sampling_args": self.sampling_args,
            "num_examples": self.num_examples,
            "rollouts_per_example": self.rollouts_per_example,
            "tags": sorted(self.tags),
        }

    def validate(self) -> None:
        if self.num_examples == 0 or self.num_examples < -1:
            raise VfopsError("--num-examples must be positive (or -1 for all examples)")
        if self.rollouts_per_example <= 0:
            raise VfopsError("--rollouts-per-example must be a positive integer")
        if self.max_concurrent <= 0:
            raise VfopsError("--max-concurrent must be a positive integer")


@dataclass
class EvalResult:
    run_dir: Path | None
    summary: EvalSummary
    status: str
    metadata: dict[str, Any]


def new_run_dir(output_root: Path, env_name: str, model: str, run_id: str | None = None) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    safe_model = model.replace("/", "_").replace(":", "_")
    leaf = f"{stamp}-{run_id or uuid.uuid4().hex[:6]}"
    return output_root / "evals" / f"{env_name}--{safe_model}" / leaf


async def run_eval_async(
    env: Environment,
    client: ModelClient,
    request: EvalRequest,
    *,
    run_dir: Path | None,
    resume: bool = False,
    on_group: GroupCallback | None = None,
    write_dataset_at_end: bool = True,
    sinks: Sequence[RolloutSink] = (),
    done: set[tuple[int, int]] | None = None,
    metadata_extra: dict[str, Any] | None = None,
) -> EvalResult:
    """Evaluate ``env`` with ``client``; stream records into ``run_dir`` (if given).

    With ``resume=True`` the records already in ``run_dir`` are kept and only
    missing (example_id, rollout_index) pairs are generated. Cancellation
    (Ctrl-C) keeps every group already written and marks the run interrupted.
    ``sinks`` receive every group after it is on disk; ``done`` holds keys already
    completed elsewhere (the registry), which are skipped too.
    """
    request.validate()
    summary = EvalSummary(pass_threshold=request.pass_threshold)
    done_elsewhere = set(done or ())
    done = set()
    metadata = {**_initial_metadata(request, env), **(metadata_extra or {})}
    if resume:
        if run_dir is None:
            raise VfopsError("--resume needs the run directory to resume")
        metadata = _check_resumable(run_dir, request, metadata)
        # Records on disk but not yet in the sinks (a crash between the two
        # writes) are sent on now, so nothing completed is ever regenerated.
        catch_up: list[RolloutRecord] = []
        for record in iter_records(run_dir):
            if record.key in done:
                continue
            done.add(record.key)
            summary.add(record, new=False)
            if record.key not in done_elsewhere:
                catch_up.append(record)
            if len(catch_up) >= 500:
                await _send(sinks, catch_up)
                catch_up = []
        await _send(sinks, catch_up)
    done |= done_elsewhere
    writer = RolloutWriter(run_dir) if run_dir is not None else None
    if run_dir is not None:
        write_metadata(run_dir, metadata)

    async def handle(records: list[RolloutRecord]) -> None:
        if writer is not None:
            writer.write_group(records)
        for sink in sinks:
            await sink.write_group(records)
        for record in records:
            summary.add(record)
        if on_group is not None:
            on_group(records, summary)

    started = time.perf_counter()
    status = "interrupted"
    try:
        await _schedule(env, client, request, done, handle)
        status = "completed"
    finally:
        summary.wall_s = time.perf_counter() - started
        if writer is not None:
            writer.close()
        metadata.update(
            status=status,
            finished_at=_now(),
            summary=summary.to_dict(),
        )
        if run_dir is not None:
            write_metadata(run_dir, metadata)
    if run_dir is not None and write_dataset_at_end:
        metadata["dataset_dir"] = str(write_dataset(run_dir, metadata))
        write_metadata(run_dir, metadata)
    return EvalResult(run_dir=run_dir, summary=summary, status=status, metadata=metadata)


async def _schedule(
    env: Environment,
    client: ModelClient,
    request: EvalRequest,
    done: set[tuple[int, int]],
    handle: Callable[[list[RolloutRecord]], Awaitable[None]],
) -> None:
    limiter = asyncio.Semaphore(request.max_concurrent)
    r = request.rollouts_per_example
    # Twice the groups needed to fill the limit: stragglers do not starve it.
    max_groups = max(2, 2 * math.ceil(request.max_concurrent / r))
    pending: set[asyncio.Task[list[RolloutRecord]]] = set()
    # Finished groups arrive on a queue (O(1) per group; asyncio.wait over
    # hundreds of pending tasks costs O(pending) per completion).
    finished: asyncio.Queue[asyncio.Task[list[RolloutRecord]]] = asyncio.Queue()

    async def collect_one() -> None:
        task = await finished.get()
        pending.discard(task)
        await handle(task.result())

    try:
        for example in env.iter_eval_examples(request.num_examples):
            indices = [i for i in range(r) if (example.example_id, i) not in done]
            if not indices:
                continue
            while len(pending) >= max_groups:
                await collect_one()
            task = asyncio.create_task(
                env.run_group(
                    client,
                    request.model,
                    example,
                    indices,
                    sampling_args=request.sampling_args,
                    limiter=limiter,
                )
            )
            pending.add(task)
            task.add_done_callback(finished.put_nowait)
        while pending:
            await collect_one()
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


async def _send(sinks: Sequence[RolloutSink], records: list[RolloutRecord]) -> None:
    if records:
        for sink in sinks:
            await sink.write_group(records)


def _initial_metadata(request: EvalRequest, env: Environment) -> dict[str, Any]:
    return {
        **request.identity(),
        "env_version": request.env_version,
        "env_class": type(env).__name__,
        "base_url": request.base_url,
        "max_concurrent": request.max_concurrent,
        "pass_threshold": request.pass_threshold,
        "vfops_version": __version__,
        "started_at": _now(),
        "status": "running",
    }


def _check_resumable(
    run_dir: Path, request: EvalRequest, metadata: dict[str, Any]
) -> dict[str, Any]:
    previous = read_metadata(run_dir)
    for key, value in request.identity().items():
        if previous.get(key) != value:
            raise VfopsError(
                f"cannot resume {run_dir}: {key} was {previous.get(key)!r}, now {value!r}; "
                "rerun with the same settings or start a new run without --resume"
            )
    return {**previous, **metadata, "started_at": previous.get("started_at"), "resumed": True}


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()
