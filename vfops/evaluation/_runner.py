"""What an evaluation runs (:class:`EvalRequest`) and the rollout scheduler.

Each example's R rollouts form a group: they are generated concurrently and
scored together as soon as the last one finishes, then handed on in one call.
At most ``max_concurrent`` rollouts are in flight; a bounded number of groups is
scheduled ahead so the limit stays saturated without holding the whole run in
memory.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vfops._errors import VfopsError
from vfops._image_map import check_image_map
from vfops._plain_json import check_plain_json
from vfops._rollout import RolloutRecord
from vfops._sampling import sampling_problems
from vfops._types import SamplingArgs
from vfops._version import __version__
from vfops.clients import ModelClient
from vfops.envs import Environment
from vfops.evaluation._store import read_metadata

_SAMPLING_FLAGS = {"temperature": "--temperature", "max_tokens": "--max-tokens"}
"""The ``vfops eval`` flag that sets a sampling argument, where one does."""


@dataclass
class EvalRequest:
    """What to run. Identity fields must match when a run is resumed."""

    env_name: str
    model: str
    num_examples: int = 5
    """Examples to evaluate, the first N of the eval set (-1: all); a run records the
    number that runs (never more than the set holds)."""
    rollouts_per_example: int = 3
    max_concurrent: int = 32
    sampling_args: SamplingArgs = field(default_factory=dict)
    env_args: dict[str, Any] = field(default_factory=dict)
    base_url: str | None = None
    env_version: str | None = None
    pass_threshold: float = 1.0
    tags: list[str] = field(default_factory=list)
    """Which schedule made the run (e.g. ``nightly:2026-11-29``); part of its identity."""
    image_map: dict[str, str] = field(default_factory=dict)
    """Image a task names -> local image its container runs (``--image-map``); part of
    the run's identity when set (another image is another run)."""

    def identity(self) -> dict[str, Any]:
        mapped = {"image_map": dict(sorted(self.image_map.items()))} if self.image_map else {}
        return {
            **mapped,
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
        for name, problem in sampling_problems(self.sampling_args)[:1]:
            flag = _SAMPLING_FLAGS.get(name)
            where = f"{flag} or --sampling-args" if flag else "--sampling-args"
            raise VfopsError(f"sampling argument {name} {problem}; set a valid value with {where}")
        # recorded as JSON with the run: an object found here, not after every rollout
        check_plain_json(self.env_args, "env_args", "-a/--env-args")
        check_plain_json(self.sampling_args, "sampling_args", "-S/--sampling-args")
        check_image_map(self.image_map, "--image-map")


def new_run_dir(output_root: Path, env_name: str, model: str, run_id: str | None = None) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    safe_model = model.replace("/", "_").replace(":", "_")
    leaf = f"{stamp}-{run_id or uuid.uuid4().hex[:6]}"
    return output_root / "evals" / f"{env_name}--{safe_model}" / leaf


async def run_rollouts(
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

    # the episodes already recorded (an episode of several traces is recorded whole)
    started = {(example_id, env.episode_of(index)) for example_id, index in done}
    try:
        for example in env.iter_eval_examples(request.num_examples):
            indices = [i for i in range(r) if (example.example_id, i) not in started]
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


def initial_metadata(request: EvalRequest, env_class: str) -> dict[str, Any]:
    """``metadata.json`` of a run starting now (the end is added when it finishes)."""
    return {
        **request.identity(),
        "env_version": request.env_version,
        "env_class": env_class,
        "base_url": request.base_url,
        "max_concurrent": request.max_concurrent,
        "pass_threshold": request.pass_threshold,
        "vfops_version": __version__,
        "started_at": now_iso(),
        "status": "running",
    }


def check_resumable(
    run_dir: Path, request: EvalRequest, metadata: dict[str, Any]
) -> dict[str, Any]:
    """The folder's metadata, merged with ``metadata``, if its run is ``request``'s."""
    previous = read_metadata(run_dir)
    for key, value in request.identity().items():
        if previous.get(key) != value:
            raise VfopsError(
                f"cannot resume {run_dir}: {key} was {previous.get(key)!r}, now {value!r}; "
                "rerun with the same settings or start a new run without --resume"
            )
    return {**previous, **metadata, "started_at": previous.get("started_at"), "resumed": True}


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat()
