"""One role, two attempts per episode, scored against each other.

Each task is a sum; the Env runs its ``writer`` role on it twice (two traces of one
episode) and, once both are done, ``finalize`` compares them: among the attempts that got
the sum right, the one with the shortest reply earns ``briefest`` (ties share it; a
wrong attempt earns nothing). Nothing is executed: the comparison is over the replies.
Each attempt's prompt carries its own stub answer (``ANSWER_HINT``, from the task's
``hints``), so the two attempts of an episode can differ: one right and one wrong, or
both right at different lengths ("12" and "012")."""

import asyncio
import re

import verifiers.v1 as vf
from pydantic import Field

SUMS = ((3, 4, ("7", "07")), (5, 6, ("11", "12")), (2, 2, ("4", "4")))


class TwiceData(vf.TaskData):
    answer: int
    hints: list[str]


def replied_number(trace: vf.Trace) -> str | None:
    found = re.search(r"<answer>\s*(\d+)\s*</answer>", trace.last_reply or "")
    return found.group(1) if found else None


class TwiceTask(vf.Task[TwiceData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        number = replied_number(trace)
        return float(number is not None and int(number) == self.data.answer)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply or ""))


class TwiceEnvConfig(vf.EnvConfig):
    writer: vf.AgentConfig = vf.AgentConfig()
    attempts: int = Field(2, ge=1)
    """Attempts of the writer per episode, each given the next of the task's hints."""


class TwiceEnv(vf.Env[TwiceEnvConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        data = task.data
        async with asyncio.TaskGroup() as group:
            for attempt in range(self.config.attempts):
                hint = data.hints[attempt % len(data.hints)]
                prompt = f"{data.prompt} ANSWER_HINT: {hint}"
                attempt_task = TwiceTask(data.model_copy(update={"prompt": prompt}), task.config)
                group.create_task(agents.writer.run(attempt_task))

    async def finalize(self, task: vf.Task, episode: vf.Episode) -> None:
        right = [t for t in episode.traces if (r := t.rewards.get("correct")) and r.score == 1.0]
        shortest = min((len(t.last_reply) for t in right), default=None)
        for trace in episode.traces:
            won = any(t is trace for t in right) and len(trace.last_reply) == shortest
            trace.record_reward("briefest", float(won), 0.5)
            trace.record_metric("right_attempts", float(len(right)))


class TwiceTaskset(vf.Taskset[TwiceTask, vf.TasksetConfig]):
    def load(self) -> list[TwiceTask]:
        return [
            TwiceTask(
                TwiceData(
                    idx=idx,
                    prompt=f"What is {a}+{b}? Answer between <answer> and </answer>.",
                    answer=a + b,
                    hints=list(hints),
                ),
                self.config.task,
            )
            for idx, (a, b, hints) in enumerate(SUMS)
        ]
