"""Several environments behind one dataset, routed by the ``task`` column."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vfops._types import SamplingArgs, State
from vfops.clients._base import ModelClient
from vfops.envs._dataset import Example, quiet_datasets
from vfops.envs._environment import Environment, Scorer

if TYPE_CHECKING:
    from datasets import Dataset


class EnvGroup(Environment):
    """Concatenates the datasets of ``envs`` and routes each row to its environment.

    Each row's ``task`` is set to its environment's name (``env_names`` or each
    environment's ``name``); rollouts and scoring go to that environment, so each
    keeps its own parser, rubric, turn logic and sampling defaults.
    ``example_id`` is renumbered so it is unique across the group.
    """

    def __init__(
        self, envs: Sequence[Environment], env_names: Sequence[str] | None = None, **kwargs: Any
    ) -> None:
        if not envs:
            raise ValueError("EnvGroup needs at least one environment")
        names = list(env_names) if env_names is not None else [e.name for e in envs]
        if len(names) != len(envs) or len(set(names)) != len(names):
            raise ValueError(f"EnvGroup needs one distinct name per environment, got {names}")
        self.envs = dict(zip(names, envs, strict=True))
        has_train = any(e.dataset is not None for e in envs)
        super().__init__(
            dataset=(lambda: self._concatenate("train")) if has_train else None,
            eval_dataset=lambda: self._concatenate("eval"),
            name=kwargs.pop("name", "env_group"),
            **kwargs,
        )

    def _concatenate(self, split: str) -> Dataset:
        from datasets import concatenate_datasets

        parts = []
        for name, env in self.envs.items():
            part = env.dataset if split == "train" else env.eval_dataset
            if part is None:
                continue
            with quiet_datasets():
                parts.append(part.map(lambda row, n=name: {"task": n}))
        # Interleave round-robin so the first N rows (``-n``) cover every member.
        offsets = [sum(len(p) for p in parts[:i]) for i in range(len(parts))]
        longest = max(len(p) for p in parts)
        order = [
            offset + row
            for row in range(longest)
            for offset, part in zip(offsets, parts, strict=True)
            if row < len(part)
        ]
        combined = concatenate_datasets(parts).select(order)
        with quiet_datasets():
            return combined.map(lambda row, i: {"example_id": i}, with_indices=True)

    async def aclose(self) -> None:
        for env in self.envs.values():
            await env.aclose()

    def env_for(self, task: str) -> Environment:
        try:
            return self.envs[task]
        except KeyError:
            raise KeyError(
                f"no environment for task '{task}' in EnvGroup; tasks: {', '.join(self.envs)}"
            ) from None

    def merged_sampling_args(self, overrides: SamplingArgs | None) -> SamplingArgs:
        # Each member merges its own defaults in rollout(); keep only the overrides here.
        return dict(overrides or {})

    def rubric_for(self, task: str) -> Scorer:
        return self.env_for(task).rubric_for(task)

    async def rollout(
        self,
        client: ModelClient,
        model: str,
        example: Example,
        *,
        rollout_index: int = 0,
        sampling_args: SamplingArgs | None = None,
    ) -> State:
        env = self.env_for(example.task)
        return await env.rollout(
            client,
            model,
            example,
            rollout_index=rollout_index,
            sampling_args=env.merged_sampling_args(sampling_args),
        )
