"""arithmetic: single-turn integer arithmetic (``What is 37 * 4?``).

Questions are generated locally with a seeded RNG (no download). The model
answers as ``<think>...</think><answer>...</answer>``; the reward is 1.0 for the
exact answer plus 0.2 for following the format.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

import vfops

SYSTEM_PROMPT = (
    "Solve the arithmetic problem. Think step by step inside <think>...</think>, "
    "then give only the final integer inside <answer>...</answer>."
)

DIFFICULTY_MAX_OPERAND = {"easy": 10, "medium": 100, "hard": 1000}
OPS = ("+", "-", "*")

_INTEGER = re.compile(r"[+-]?\d+")


def solve(a: int, op: str, b: int) -> int:
    """The value of ``a op b`` for op in ``+ - *``."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unsupported operator {op!r}; use one of {' '.join(OPS)}")


def build_dataset(
    num_examples: int,
    *,
    max_operand: int,
    ops: Sequence[str] = OPS,
    seed: int = 0,
    split: str = "eval",
) -> list[dict[str, Any]]:
    """``num_examples`` questions ``What is a op b?`` with ``0 <= a, b <= max_operand``.

    The same (split, seed) always gives the same rows; the train and eval splits
    draw from differently seeded generators.
    """
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
    return rows


def normalise_integer(text: str | None) -> str | None:
    """``" 1,234 "`` -> ``"1234"``, ``"+5"`` -> ``"5"``; None when not a plain integer."""
    if text is None:
        return None
    cleaned = text.strip().replace(",", "").replace(" ", "")
    if not _INTEGER.fullmatch(cleaned):
        return None
    return str(int(cleaned))


def correct_answer(completion: list[dict[str, Any]], answer: str, parser: vfops.Parser) -> float:
    """1.0 when the parsed <answer> is exactly the reference integer."""
    parsed = normalise_integer(parser.parse_answer(completion))
    return 1.0 if parsed is not None and parsed == answer else 0.0


def load_environment(
    num_examples: int = 1000,
    num_train_examples: int = 1000,
    difficulty: str = "medium",
    max_operand: int | None = None,
    ops: str | Sequence[str] = OPS,
    seed: int = 0,
    max_tokens: int | None = 256,
    system_prompt: str = SYSTEM_PROMPT,
) -> vfops.Environment:
    """Build the arithmetic environment.

    Args:
        num_examples: Rows of the eval split.
        num_train_examples: Rows of the train split (0 for none).
        difficulty: ``easy`` (operands up to 10), ``medium`` (100) or ``hard`` (1000).
        max_operand: Largest operand; overrides ``difficulty`` when given.
        ops: Operators to draw from, any of ``+ - *`` (a string such as ``"+-"`` or a list).
        seed: Seed of the question generator.
        max_tokens: Default ``max_tokens`` sampling argument (None for the server's default).
        system_prompt: The system prompt.
    """
    if max_operand is None:
        if difficulty not in DIFFICULTY_MAX_OPERAND:
            raise ValueError(
                f"difficulty must be one of {sorted(DIFFICULTY_MAX_OPERAND)}, got {difficulty!r}"
            )
        max_operand = DIFFICULTY_MAX_OPERAND[difficulty]
    if max_operand < 1:
        raise ValueError(f"max_operand must be at least 1, got {max_operand}")
    op_list = [op for op in ops if not op.isspace()]
    unknown = [op for op in op_list if op not in OPS]
    if not op_list or unknown:
        raise ValueError(f"ops must be a non-empty selection of {' '.join(OPS)}, got {ops!r}")
    if num_examples < 1 or num_train_examples < 0:
        raise ValueError("num_examples must be positive and num_train_examples non-negative")

    bound = max_operand

    parser = vfops.XMLParser(["think", "answer"])
    rubric = vfops.Rubric(parser=parser)
    rubric.add_reward_func(correct_answer, weight=1.0)
    rubric.add_reward_func(parser.get_format_reward_func(), weight=0.2)
    return vfops.SingleTurnEnv(
        dataset=(
            (
                lambda: build_dataset(
                    num_train_examples, max_operand=bound, ops=op_list, seed=seed, split="train"
                )
            )
            if num_train_examples
            else None
        ),
        eval_dataset=lambda: build_dataset(
            num_examples, max_operand=bound, ops=op_list, seed=seed, split="eval"
        ),
        system_prompt=system_prompt,
        parser=parser,
        rubric=rubric,
        sampling_args={"max_tokens": max_tokens} if max_tokens else None,
        name="arithmetic",
    )
