"""A word list kept sorted across turns, from a stream of episodes that never ends.

``load()`` yields tasks forever (``INFINITE``): a run takes the first N with ``-n``. A
task has no prompt; the taskset's ``Env`` is its user, sending the task's turns one at a
time, each adding a few words and asking for the whole list so far sorted without regard
to case. The reward is the share of turns answered with exactly that list. Words are
drawn with and without a capital letter, so a case-sensitive sort goes wrong on some
turns and not on others."""

import random
import re
from collections.abc import Iterator
from itertools import count

import verifiers.v1 as vf

WORDS = (
    "pear", "Apple", "fig", "banana", "Cherry", "date", "grape", "Kiwi", "lemon", "mango",
    "Olive", "plum", "quince", "raisin", "Sloe", "tangerine",
)  # fmt: skip
SEED = 7


def listed(reply: str) -> list[str]:
    found = re.search(r"<list>(.*?)</list>", reply, re.DOTALL)
    return [w.strip() for w in found.group(1).split(",") if w.strip()] if found else []


class EndlessData(vf.TaskData):
    info: dict


class EndlessTask(vf.Task[EndlessData]):
    @vf.reward(weight=1.0)
    async def sorted_turns(self, trace: vf.Trace) -> float:
        expected = self.data.info["expected"]
        replies = [m.content or "" for m in trace.assistant_messages]
        right = sum(listed(r) == e for r, e in zip(replies, expected, strict=False))
        return right / len(expected)

    @vf.metric
    async def words_shown(self, trace: vf.Trace) -> float:
        return float(len(self.data.info["expected"][-1]))


class EndlessConfig(vf.TasksetConfig):
    max_turns: int = 3
    words_per_turn: int = 2


class EndlessEnv(vf.SingleAgentEnv):
    """The user: sends each of the task's turns after the previous reply."""

    async def run(self, task, agents):
        async with agents.agent.interaction(task) as interaction:
            for message in task.data.info["turns"]:
                if (await interaction.turn(message)).terminated:
                    break


class EndlessTaskset(vf.Taskset[EndlessTask, EndlessConfig]):
    INFINITE = True

    def load(self) -> Iterator[EndlessTask]:
        c = self.config
        rng = random.Random(SEED)
        for idx in count():
            turns, expected, so_far = [], [], []
            for _ in range(rng.randint(1, c.max_turns)):
                added = rng.sample([w for w in WORDS if w not in so_far], c.words_per_turn)
                so_far += added
                turns.append(
                    f"Add {', '.join(added)} to the list and reply with the whole list "
                    "sorted alphabetically, ignoring case, comma-separated between "
                    "<list> and </list>."
                )
                expected.append(sorted(so_far, key=str.lower))
            info = {"turns": turns, "expected": expected}
            yield EndlessTask(EndlessData(idx=idx, prompt=None, info=info), c.task)
