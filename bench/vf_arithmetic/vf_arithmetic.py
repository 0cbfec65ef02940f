"""vf_arithmetic: the ``verifiers`` twin of vfops' ``environments/arithmetic``.

Used only by ``bench/eval_overhead.py``, which installs it into its own
``verifiers`` virtualenv and runs ``vf-eval vf_arithmetic``. Same questions
(``What is a op b?`` from the same seeded RNG, so row i is identical to vfops'
row i), same system prompt, same parser (XMLParser with think/answer) and the
same reward: 1.0 for the exact integer answer plus 0.2 for the format. Single
turn. The dataset is built locally with ``Dataset.from_list`` (no hub download).
"""

from __future__ import annotations

import random
import re
from typing import Any

import verifiers as vf
from datasets import Dataset

SYSTEM_PROMPT = (
    "Solve the arithmetic problem. Think step by step inside <think>...</think>, "
    "then give only the final integer inside <answer>...</answer>."
)

DIFFICULTY_MAX_OPERAND = {"easy": 10, "medium": 100, "hard": 1000}
OPS = ("+", "-", "*")

_INTEGER = re.compile(r"[+-]?\d+")


def solve(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unsupported operator {op!r}")


def build_dataset(
    num_examples: int,
    *,
    max_operand: int,
    ops: tuple[str, ...] = OPS,
    seed: int = 0,
    split: str = "eval",
) -> Dataset:
    """Identical rows to vfops' ``arithmetic.build_dataset`` for the same arguments."""
    rng = random.Random(f"arithmetic:{split}:{seed}")
    rows: list[dict[str, Any]] = []
    for _ in range(num_examples):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        op = rng.choice(list(ops))
        rows.append(
            {
                "question": f"What is {a} {op} {b}?",
                "answer": str(solve(a, op, b)),
                "info": {"a": a, "op": op, "b": b},
            }
        )
    return Dataset.from_list(rows)


def normalise_integer(text: str | None) -> str | None:
    if text is None:
        return None
    cleaned = text.strip().replace(",", "").replace(" ", "")
    if not _INTEGER.fullmatch(cleaned):
        return None
    return str(int(cleaned))


def load_environment(
    num_examples: int = 1000,
    difficulty: str = "medium",
    seed: int = 0,
    **kwargs: Any,
) -> vf.Environment:
    max_operand = DIFFICULTY_MAX_OPERAND[difficulty]
    parser = vf.XMLParser(["think", "answer"], answer_field="answer")

    def correct_answer(completion: Any, answer: str, **_: Any) -> float:
        parsed = normalise_integer(parser.parse_answer(completion))
        return 1.0 if parsed is not None and parsed == answer else 0.0

    rubric = vf.Rubric(parser=parser)
    rubric.add_reward_func(correct_answer, weight=1.0)
    rubric.add_reward_func(parser.get_format_reward_func(), weight=0.2)
    return vf.SingleTurnEnv(
        eval_dataset=build_dataset(num_examples, max_operand=max_operand, seed=seed, split="eval"),
        system_prompt=SYSTEM_PROMPT,
        parser=parser,
        rubric=rubric,
        **kwargs,
    )
