"""vf_xml_math: a single-turn ``verifiers`` environment (vfops test material).

``vf.SingleTurnEnv`` with ``vf.XMLParser(["think", "answer"])``. Rows are seeded
arithmetic questions ``What is a op b?`` (built locally with
``Dataset.from_list``, no hub download) with the integer ``answer`` as a string.
Rubric: ``correct_answer`` (weight 1.0: the parsed ``<answer>`` equals the
answer) plus the parser's ``format_reward_func`` (weight 0.2). SingleTurnEnv adds
its ``num_turns`` metric (weight 0) on its own.
"""

from __future__ import annotations

import random
from typing import Any

import verifiers as vf
from datasets import Dataset

SYSTEM_PROMPT = (
    "Solve the arithmetic problem. Think step by step inside <think>...</think>, "
    "then give only the final integer inside <answer>...</answer>."
)
OPS = ("+", "-", "*")


def solve(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unsupported operator {op!r}")


def build_rows(num_examples: int, *, seed: int = 0, max_operand: int = 20) -> list[dict[str, Any]]:
    rng = random.Random(f"vf_xml_math:{seed}")
    rows: list[dict[str, Any]] = []
    for _ in range(num_examples):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        op = rng.choice(OPS)
        rows.append({"question": f"What is {a} {op} {b}?", "answer": str(solve(a, op, b))})
    return rows


def normalise_integer(text: str | None) -> str | None:
    if text is None:
        return None
    cleaned = text.strip().replace(",", "")
    try:
        return str(int(cleaned))
    except ValueError:
        return None


def load_environment(
    num_examples: int = 20,
    seed: int = 0,
    system_prompt: str = SYSTEM_PROMPT,
    **kwargs: Any,
) -> vf.Environment:
    parser = vf.XMLParser(["think", "answer"], answer_field="answer")

    def correct_answer(completion: vf.Messages, answer: str, **_: Any) -> float:
        parsed = normalise_integer(parser.parse_answer(completion))
        return 1.0 if parsed is not None and parsed == answer else 0.0

    rubric = vf.Rubric(parser=parser)
    rubric.add_reward_func(correct_answer, weight=1.0)
    rubric.add_reward_func(parser.get_format_reward_func(), weight=0.2)
    return vf.SingleTurnEnv(
        eval_dataset=Dataset.from_list(build_rows(num_examples, seed=seed)),
        system_prompt=system_prompt,
        parser=parser,
        rubric=rubric,
        **kwargs,
    )
