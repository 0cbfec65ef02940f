"""Generation scheduling: which batch is generated when, by which weights, on which data.

Heavy module (torch, for saving the batches generated ahead), imported lazily by
the recipe. This is the orchestrator half of the recipe (prime-rl's split): it owns
the batches in flight and never touches the optimizer; the recipe hands it the step
number and the weights' version.

With ``async_steps = k`` the batches of the next k steps are already being generated
while this one trains: batch ``j`` by exactly the weights of step ``max(0, j - k)``
(:meth:`GenerationScheduler.finish_on_current_weights` holds each sync until the
batches those weights owe are done), so the off-policy lag is deterministic, not a
matter of thread timing, and a run resumes exactly: a checkpoint keeps the batches
generated ahead (:meth:`~GenerationScheduler.save_ahead`). ``max_staleness`` drops
and regenerates a batch whose weights are too old (:meth:`~GenerationScheduler.next_batch`).

Data order is a pure function of (seed, step, rank): a seeded permutation per epoch,
sharded by rank (:meth:`~GenerationScheduler.step_examples`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vfops._errors import VfopsError
from vfops._types import SamplingArgs
from vfops.envs import Environment, Example
from vfops.training._backend import GenerationBackend
from vfops.training._batch import Batch, Groups, batch_from_dict
from vfops.training._config import GenerationConfig
from vfops.training._loop import GenerationLoop

logger = logging.getLogger("vfops.training._recipe")  # the recipe's log, as before the split

BatchMaker = Callable[[int, Groups, float], Batch]
"""``(step index, groups, generation seconds) -> Batch``: the recipe's ``_to_batch``."""


def derive(seed: int, *parts: object) -> int:
    """A 63-bit seed derived from ``seed`` and ``parts`` (stable across processes)."""
    digest = hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass(frozen=True, slots=True)
class Rollouts:
    """Where rollouts come from: the environment, the backend's client under the policy's
    name, and the loop's shared limiter. Training batches and held-out eval use the same."""

    env: Environment
    backend: GenerationBackend
    model: str
    limiter: asyncio.Semaphore

    async def groups(
        self,
        examples: Iterable[Example],
        rollouts: Sequence[int],
        sampling_args: Callable[[int], SamplingArgs],
    ) -> Groups:
        """One group of ``rollouts`` per example; ``sampling_args(position)`` per example."""
        return await asyncio.gather(
            *(
                self.env.run_group_states(
                    self.backend.client,
                    self.model,
                    example,
                    rollouts,
                    sampling_args=sampling_args(position),
                    limiter=self.limiter,
                )
                for position, example in enumerate(examples)
            )
        )


@dataclass(frozen=True, slots=True)
class DataShard:
    """This rank's view of the train split: ``world`` ranks, this one ``rank``."""

    examples: list[Example]
    world: int
    rank: int


class GenerationScheduler:
    """The batches in flight, keyed by the step that trains on them.

    ``config`` is ``[generation]`` (``prompts_per_step``, ``group_size``, ``async_steps``,
    ``max_staleness``, sampling); ``seed`` is ``[run] seed``; ``to_batch`` turns a step's
    groups into its :class:`~vfops.training._batch.Batch`.
    """

    def __init__(
        self,
        config: GenerationConfig,
        *,
        seed: int,
        loop: GenerationLoop,
        rollouts: Rollouts,
        data: DataShard,
        to_batch: BatchMaker,
    ) -> None:
        self.config = config
        self.seed = seed
        self.loop = loop
        self.rollouts = rollouts
        self.data = data
        self.to_batch = to_batch
        self.pending: dict[int, concurrent.futures.Future[Batch]] = {}
        self.stale_batches_dropped = 0
        """Batches dropped over the run for exceeding ``max_staleness``."""

    def schedule(self, step: int) -> None:
        """Start generating every batch up to ``step + async_steps`` not yet started."""
        for index in range(step, step + self.config.async_steps + 1):
            if index not in self.pending:
                self.pending[index] = self.loop.submit(self.generate_batch(index))

    def next_batch(self, step: int) -> tuple[Batch, int]:
        """Step ``step``'s batch (waiting for it), and how many were dropped as stale."""
        return self._fresh_batch(self.loop.wait(self.pending.pop(step)), step)

    def _fresh_batch(self, batch: Batch, step: int) -> tuple[Batch, int]:
        """``batch``, or when one of its turns is older than ``max_staleness`` steps, a
        batch generated again by the current weights (lag 0); and how many were dropped."""
        bound = self.config.max_staleness
        if bound is None or step - batch.min_policy_version <= bound:
            return batch, 0
        logger.info(
            "step %d: dropping a batch generated by the weights of step %d (max_staleness "
            "= %d); generating it again",
            step,
            batch.min_policy_version,
            bound,
        )
        self.stale_batches_dropped += 1
        fresh: Batch = self.loop.run(self.generate_batch(step))
        if fresh.min_policy_version != step:
            raise VfopsError(
                f"the generation backend reports the weights of step {fresh.min_policy_version} "
                f"after the sync of step {step}; check that its weight sync reaches it"
            )
        return fresh, 1

    def finish_on_current_weights(self, step: int) -> None:
        """Wait for every batch that must be generated by the weights about to be replaced.

        ``step`` counts the optimizer steps taken, the new weights included. Batch ``j``
        is generated by policy version ``max(0, j - k)`` exactly: it starts after that
        version is synced (it is scheduled one step later), and the next sync waits here
        until it is done. So the off-policy lag is deterministic (k once the pipeline is
        full), not a matter of thread timing, and a run with ``async_steps = k`` is
        reproducible and resumes exactly.
        """
        last = step - 1 + self.config.async_steps
        for index in sorted(i for i in self.pending if i <= last):
            self.loop.wait(self.pending[index])

    async def generate_batch(self, index: int) -> Batch:
        """Generate step ``index``'s batch with the weights the backend has now."""
        started = time.perf_counter()
        groups = await self.rollouts.groups(
            self.step_examples(index),
            range(self.config.group_size),
            lambda position: self.sampling_args(index, position),
        )
        return self.to_batch(index, groups, time.perf_counter() - started)

    def sampling_args(self, index: int, position: int) -> SamplingArgs:
        """What step ``index``'s prompt at ``position`` is sampled with."""
        gen = self.config
        args: SamplingArgs = {"max_tokens": gen.max_tokens, "temperature": gen.temperature}
        if gen.backend == "hf":
            # Reproducible draws per (seed, step, prompt); the hf backend varies the
            # stream per rollout itself. Not sent to vLLM, where one seed for every
            # rollout of a group would make them identical.
            args["seed"] = derive(self.seed, "batch", index, position)
        return args

    def step_examples(self, index: int) -> list[Example]:
        """The prompts step ``index`` trains on (this rank's share): a seeded permutation
        per epoch, sharded by rank, so a run and its resume see the same data order."""
        per_rank = self.config.prompts_per_step
        start = (index * self.data.world + self.data.rank) * per_rank
        return [self._example_at(p) for p in range(start, start + per_rank)]

    def _example_at(self, position: int) -> Example:
        examples = self.data.examples
        epoch, offset = divmod(position, len(examples))
        order = list(range(len(examples)))
        random.Random(derive(self.seed, "epoch", epoch)).shuffle(order)
        return examples[order[offset]]

    # ------------------------------------------------------------------ checkpoints

    def save_ahead(self, path: Path, step: int) -> None:
        """Keep the batches generated ahead (``async_steps > 0``) in ``path``: their
        weights are gone after this step, so a resume could not generate them again."""
        self.finish_on_current_weights(step)
        ahead = {
            index: future.result()
            for index, future in self.pending.items()
            if index >= step and future.done() and not future.cancelled()
        }
        torch.save({index: dataclasses.asdict(batch) for index, batch in ahead.items()}, path)

    def load_ahead(self, path: Path) -> None:
        """Restore the batches :meth:`save_ahead` kept (none when ``path`` is missing)."""
        if not path.is_file():
            return
        saved: dict[int, dict[str, Any]] = torch.load(path, weights_only=False)
        for index, fields in saved.items():
            done: concurrent.futures.Future[Batch] = concurrent.futures.Future()
            done.set_result(batch_from_dict(fields))
            self.pending[int(index)] = done

    def drop_pending(self) -> None:
        """Cancel the batches in flight and wait until none is running."""
        for future in self.pending.values():
            future.cancel()
        for future in self.pending.values():
            with contextlib.suppress(BaseException):
                future.result(timeout=60)
        self.pending.clear()
