"""vfops's lucky_digit (environments/lucky_digit) written as a verifiers v1 taskset: reply
with the asked digit and stop. The answer depends on the prompt (0 or 1 in turn), so a
policy that ignores the prompt scores at most 0.6; ``answered`` (0.5) needs the exact digit
and a reply the model ended itself, ``starts_with_the_digit`` (0.3) and ``stopped`` (0.2)
shape it, so random completions already differ within a group. The train and eval splits
use different phrasings and filler words."""

import random
from typing import Literal

import verifiers.v1 as vf

TEMPLATES = {
    "train": (
        "Say the digit {d}. ({w})", "Write {d} now, {w}.", "Digit {d} please: {w}",
        "{w}, then reply {d}.", "The {w} wants {d}.", "Reply {d} ({w})",
    ),
    "eval": ("Give me the digit {d} ({w})", "{w}: answer with {d}."),
}  # fmt: skip
WORDS = {
    "train": ("apple", "river", "stone", "cloud", "green", "table", "light", "music"),
    "eval": ("ocean", "policy", "token", "batch", "score", "model"),
}


class DigitData(vf.TaskData):
    answer: str


class DigitTask(vf.Task[DigitData]):
    def _reply(self, trace: vf.Trace) -> str:
        return "".join((m.content or "") for m in trace.assistant_messages)

    def _stopped(self, trace: vf.Trace) -> bool:
        return not trace.is_truncated

    @vf.reward(weight=0.5)
    async def answered(self, trace: vf.Trace) -> float:
        reply = "".join(self._reply(trace).split())
        return float(self._stopped(trace) and reply == self.data.answer)

    @vf.reward(weight=0.3)
    async def starts_with_the_digit(self, trace: vf.Trace) -> float:
        return float("".join(self._reply(trace).split())[:1] == self.data.answer)

    @vf.reward(weight=0.2)
    async def stopped(self, trace: vf.Trace) -> float:
        return float(self._stopped(trace) and bool(self._reply(trace).strip()))


class DigitConfig(vf.TasksetConfig):
    split: Literal["train", "eval"] = "train"
    num_tasks: int = 256
    digits: str = "01"
    seed: int = 0


class LuckyDigitTaskset(vf.Taskset[DigitTask, DigitConfig]):
    def load(self):
        c = self.config
        rng = random.Random(f"lucky_digit:{c.split}:{c.seed}")
        for index in range(c.num_tasks):
            digit = c.digits[index % len(c.digits)]
            prompt = rng.choice(TEMPLATES[c.split]).format(d=digit, w=rng.choice(WORDS[c.split]))
            data = DigitData(
                system_prompt="Reply with the digit only.", prompt=prompt, answer=digit
            )
            yield DigitTask(data, c.task)
