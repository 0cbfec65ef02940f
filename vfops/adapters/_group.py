"""The base of an adapted library's environment: the library rolls out and scores a group
its own way (:meth:`~vfops.envs.Environment.run_group_states`, overridden), and one
rollout is a group of one."""

from __future__ import annotations

from vfops._types import SamplingArgs, State
from vfops.clients import ModelClient
from vfops.envs import Environment, Example


class GroupEnvironment(Environment):
    """An environment whose :meth:`run_group_states` is the library's; see the module doc."""

    async def rollout(
        self,
        client: ModelClient,
        model: str,
        example: Example,
        *,
        rollout_index: int = 0,
        sampling_args: SamplingArgs | None = None,
    ) -> State:
        states, _ = await self.run_group_states(
            client, model, example, [rollout_index], sampling_args=sampling_args
        )
        return states[0]
