"""A multi-turn v1 taskset whose user is scripted, as upstream's alphabet_sort drives its
episodes (offline here): the task has no prompt, the taskset's ``Env`` opens the
conversation with the first of the task's user turns and answers each reply with the
next, through ``agents.agent.interaction``. Each user turn asks for a number (with the
stub endpoint's ``ANSWER_HINT``, right with probability ``accuracy``); the reward is the
share of turns answered with the asked number, in order."""

import random
import re

import verifiers.v1 as vf


class ScriptedData(vf.TaskData):
    info: dict


class ScriptedTask(vf.Task[ScriptedData]):
    @vf.reward
    async def turns_right(self, trace: vf.Trace) -> float:
        asked = self.data.info["answers"]
        replies = [m.content or "" for m in trace.assistant_messages]
        right = 0
        for answer, reply in zip(asked, replies, strict=False):
            found = re.search(r"<answer>(.*?)</answer>", reply)
            right += found is not None and found.group(1).strip() == answer
        return right / len(asked)

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class ScriptedUserConfig(vf.TasksetConfig):
    size: int = 12
    turns: int = 3
    accuracy: float = 0.7


class ScriptedUserEnv(vf.SingleAgentEnv):
    """Replays each task's user turns as the run's user."""

    async def run(self, task, agents):
        async with agents.agent.interaction(task) as interaction:
            for prompt in task.data.info["user_turns"]:
                if (await interaction.turn(prompt)).terminated:
                    break


class ScriptedUserTaskset(vf.Taskset[ScriptedTask, ScriptedUserConfig]):
    def load(self):
        c = self.config
        rng = random.Random(0)
        for _ in range(c.size):
            turns, answers = [], []
            for k in range(c.turns):
                a, b = rng.randint(1, 99), rng.randint(1, 99)
                hint = a + b if rng.random() < c.accuracy else a + b + 1
                turns.append(f"Turn {k + 1}: what is {a}+{b}? ANSWER_HINT: {hint}")
                answers.append(str(a + b))
            info = {"user_turns": turns, "answers": answers}
            yield ScriptedTask(ScriptedData(prompt=None, info=info))
