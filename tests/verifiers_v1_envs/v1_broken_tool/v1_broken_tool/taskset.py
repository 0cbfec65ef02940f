"""Read a value with a tool that always fails: the reward is 1 when the reply carries the
value, so every rollout scores 0 — not because the model is weak, but because every tool
call failed. vfops must say so in the run's summary (and fail it on request)."""

import verifiers.v1 as vf

from v1_broken_tool.server import VaultToolset

KEYS = ("alpha", "beta", "gamma")


class BrokenToolData(vf.TaskData):
    key: str


class BrokenToolTask(vf.Task[BrokenToolData, vf.State]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [VaultToolset(vf.ToolsetConfig())]

    @vf.reward(weight=1.0)
    async def found(self, trace: vf.Trace) -> float:
        return float(f"value-of-{self.data.key}" in (trace.last_reply or ""))


class BrokenToolTaskset(vf.Taskset[BrokenToolTask, vf.TasksetConfig]):
    def load(self) -> list[BrokenToolTask]:
        return [
            BrokenToolTask(
                BrokenToolData(idx=i, key=key, prompt=f'Read the key "{key}" with the vault tool.'),
                self.config.task,
            )
            for i, key in enumerate(KEYS)
        ]
