"""Words to spell backwards, from a list kept in the package and read through
``datasets.Dataset.from_list``. The package declares ``datasets`` alone: verifiers is
what runs it, not what it asks pip for (the shape of upstream's reverse_text and gsm8k).
Each prompt carries the stub endpoint's reply (``ANSWER_HINT: x``), right for most words
and wrong for the rest, so a run scores both."""

import verifiers.v1 as vf
from datasets import Dataset

WORDS = [
    ("stone", "enots"),
    ("river", "revir"),
    ("maple", "elpam"),
    ("cloud", "dulco"),  # the hint is wrong: this one scores 0
    ("amber", "rebma"),
    ("flint", "tnilf"),
]


class MirrorData(vf.TaskData):
    answer: str


class MirrorTask(vf.Task[MirrorData]):
    @vf.reward(weight=1.0)
    async def reversed_exactly(self, trace: vf.Trace) -> float:
        reply = trace.last_reply or ""
        return float(reply.strip() == f"<answer>{self.data.answer}</answer>")


class MirrorConfig(vf.TasksetConfig):
    size: int = len(WORDS)


class MirrorTaskset(vf.Taskset[MirrorTask, MirrorConfig]):
    def load(self) -> list[MirrorTask]:
        rows = Dataset.from_list([{"word": w, "hint": h} for w, h in WORDS])
        return [
            MirrorTask(
                MirrorData(
                    idx=i,
                    prompt=f"Spell '{row['word']}' backwards. ANSWER_HINT: {row['hint']}",
                    answer=row["word"][::-1],
                ),
                self.config.task,
            )
            for i, row in enumerate(rows.select(range(min(self.config.size, len(rows)))))
        ]
