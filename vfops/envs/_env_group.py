"""Several environments behind one dataset, routed by the ``task`` column."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vfops._errors import InvalidArgumentError
from vfops._types import SamplingArgs, State
from vfops.clients import ModelClient
from vfops.envs._dataset import Example, FormattedSplit, is_dataset, quiet_datasets
from vfops.envs._environment import Environment, Scorer

if TYPE_CHECKING:
    from datasets import Dataset


class EnvGroup(Environment):
    """Concatenates the datasets of ``envs`` and routes each row to its environment.

    Each row's ``task`` is set to its environment's name (``env_names`` or each
    environment's ``name``); rollouts and scoring go to that environment, so each
    keeps its own parser, rubric, turn logic and sampling defaults.
    ``example_id`` is renumbered so it is unique across the group. When every
    member's split is plain rows, so is the group's (no ``datasets`` import).
    """

    def __init__(
        self, envs: Sequence[Environment], env_names: Sequence[str] | None = None, **kwargs: Any
    ) -> None:
        if not envs:
            raise InvalidArgumentError("EnvGroup needs at least one environment")
        names = list(env_names) if env_names is not None else [e.name for e in envs]
        if len(names) != len(envs) or len(set(names)) != len(names):
            raise InvalidArgumentError(
                f"EnvGroup needs one distinct name per environment, got {names}"
            )
        self.envs = dict(zip(names, envs, strict=True))
        has_train = any(e._formatted_split("train") is not None for e in envs)
        super().__init__(
            dataset=(lambda: self._concatenate("train")) if has_train else None,
            eval_dataset=lambda: self._concatenate("eval"),
            name=kwargs.pop("name", "env_group"),
            **kwargs,
        )

    def _concatenate(self, split: str) -> FormattedSplit:
        members: dict[str, FormattedSplit] = {}
        for name, env in self.envs.items():
            part = env._formatted_split("train") if split == "train" else env._eval_split()
            if part is not None:
                members[name] = part
        if any(is_dataset(part) for part in members.values()):
            return self._concatenate_datasets(split)
        rows = [{**row, "task": name} for name, part in members.items() for row in part]
        order = _interleaved([len(part) for part in members.values()])
        return [{**rows[at], "example_id": i} for i, at in enumerate(order)]

    def _concatenate_datasets(self, split: str) -> Dataset:
        from datasets import concatenate_datasets

        parts = []
        for name, env in self.envs.items():
            part = env.dataset if split == "train" else env.eval_dataset
            if part is None:
                continue
            with quiet_datasets():
                parts.append(part.map(lambda row, n=name: {"task": n}))
        combined = concatenate_datasets(parts).select(_interleaved([len(p) for p in parts]))
        with quiet_datasets():
            return combined.map(lambda row, i: {"example_id": i}, with_indices=True)

    def drop_built_rows(self) -> None:
        super().drop_built_rows()
        for env in self.envs.values():
            env.drop_built_rows()

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


def _interleaved(lengths: list[int]) -> list[int]:
    """Indices into the parts laid end to end, taken round-robin so that the first N
    rows (``-n``) cover every member."""
    offsets = [sum(lengths[:i]) for i in range(len(lengths))]
    return [
        offset + row
        for row in range(max(lengths))
        for offset, length in zip(offsets, lengths, strict=True)
        if row < length
    ]
