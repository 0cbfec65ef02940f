"""Short factual questions with a reference answer and no grading code of their own.

The grade comes from a judge given with the run's arguments, e.g. verifiers' reference
judge: ``{"task": {"judges": [{"id": "reference", "model": ..., "base_url": ...}]}}``;
it compares the reply with the task's ``answer`` and scores 1 or 0 under its own reward
name (``reference``). The task's own reward (``tagged``, weight 0) and metric only
describe the reply. Each prompt carries the stub endpoint's answer (``ANSWER_HINT``),
some of them wrong."""

import re

import verifiers.v1 as vf

QUESTIONS = (
    ("Which planet is called the red planet?", "Mars", "Mars"),
    ("What is the chemical symbol of gold?", "Au", "Ag"),
    ("How many legs does a spider have?", "eight", "Eight"),
    ("Which ocean is the largest?", "Pacific", "Atlantic"),
)


class JudgedData(vf.TaskData):
    answer: str


class JudgedTask(vf.Task[JudgedData]):
    @vf.reward(weight=0.0)
    async def tagged(self, trace: vf.Trace) -> float:
        return float(re.search(r"<answer>.*?</answer>", trace.last_reply or "") is not None)

    @vf.metric
    async def reply_words(self, trace: vf.Trace) -> float:
        return float(len((trace.last_reply or "").split()))


class JudgedTaskset(vf.Taskset[JudgedTask, vf.TasksetConfig]):
    def load(self) -> list[JudgedTask]:
        return [
            JudgedTask(
                JudgedData(idx=idx, prompt=f"{question} ANSWER_HINT: {hint}", answer=answer),
                self.config.task,
            )
            for idx, (question, answer, hint) in enumerate(QUESTIONS)
        ]
