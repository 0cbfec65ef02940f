"""Additions whose prompt carries the stub endpoint's answer (``ANSWER_HINT: n``), right
with probability ``accuracy``: the mean reward of a run is that accuracy, within noise.
A weighted reward, a zero-weight one (its weight set through verifiers' own
``task.rewards`` plug), a metric and a stop hook exercise the task hooks."""

import random
import re

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: str


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        found = re.search(r"<answer>(.*?)</answer>", trace.last_reply or "")
        return float(found is not None and found.group(1).strip() == self.data.answer)

    @vf.reward(weight=0.0)
    async def formatted(self, trace: vf.Trace) -> float:
        return float("<answer>" in (trace.last_reply or ""))

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply or ""))

    @vf.stop
    async def one_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1


class ArithConfig(vf.TasksetConfig):
    size: int = 100
    accuracy: float = 0.7
    seed: int = 0


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for _ in range(self.config.size):
            a, b = rng.randint(1, 99), rng.randint(1, 99)
            hint = a + b if rng.random() < self.config.accuracy else a + b + 1
            data = ArithData(prompt=f"What is {a}+{b}? ANSWER_HINT: {hint}", answer=str(a + b))
            yield ArithTask(data, self.config.task)
