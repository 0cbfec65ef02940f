"""The shape of upstream's ``gsm8k``: single-turn, the reward a uv script run in the
rollout's runtime (``runtime.run_uv_script``), prepared in ``setup``. The prompt carries
the scripted endpoint's answer (``ANSWER_HINT``): right, off by one, or written as a
fraction or a decimal that the script must still grade right."""

import random
from pathlib import Path

import verifiers.v1 as vf

CHECK = (Path(__file__).parent / "check.py").read_bytes()


class VerifiedData(vf.TaskData):
    answer: str


class VerifiedTask(vf.Task[VerifiedData]):
    async def setup(self, runtime: vf.Runtime) -> None:
        await runtime.prepare_uv_script(CHECK)

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace, runtime: vf.Runtime) -> float:
        result = await runtime.run_uv_script(CHECK, args=[self.data.answer, trace.last_reply or ""])
        if result.exit_code != 0:
            raise RuntimeError(f"check.py failed: exit {result.exit_code}")
        return float(result.stdout.strip().splitlines()[-1])

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply or ""))


class VerifiedConfig(vf.TasksetConfig):
    size: int = 50
    seed: int = 0


class VerifiedTaskset(vf.Taskset[VerifiedTask, VerifiedConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for _ in range(self.config.size):
            a, b = rng.randint(1, 50), rng.randint(1, 50)
            hint = rng.choice([str(a + b), str(a + b + 1), f"{2 * (a + b)}/2", f"{a + b}.0"])
            data = VerifiedData(prompt=f"What is {a}+{b}? ANSWER_HINT: {hint}", answer=str(a + b))
            yield VerifiedTask(data, self.config.task)
