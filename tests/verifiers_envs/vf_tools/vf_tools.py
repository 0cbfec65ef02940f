"""vf_tools: a tool-calling ``verifiers`` environment (vfops test material).

``vf.ToolEnv`` with two plain Python tools, ``add`` and ``multiply`` (their
schemas come from the type hints and docstrings). Each row asks for
``(a + b) * c``; the intended path is three turns: call ``add``, call
``multiply`` on its result, answer ``<answer>N</answer>``. ``max_turns`` is 4.

Rubric: ``correct_answer`` (weight 1.0: the ``<answer>`` of the *final*
assistant message equals the answer) and ``used_tools`` (weight 0.2: 1.0 when
a tool result is in the completion). ToolEnv adds ``total_tool_calls``,
``add_calls`` and ``multiply_calls``, MultiTurnEnv ``num_turns`` (all weight 0).
"""

from __future__ import annotations

import random
from typing import Any

import verifiers as vf
from datasets import Dataset

SYSTEM_PROMPT = (
    "You have two tools, add and multiply. Use them to compute the expression step "
    "by step, then reply with only the final integer inside <answer>...</answer>."
)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.

    Returns:
        The sum a + b.
    """
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.

    Returns:
        The product a * b.
    """
    return a * b


def build_rows(num_examples: int, *, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(f"vf_tools:{seed}")
    rows: list[dict[str, Any]] = []
    for _ in range(num_examples):
        a, b, c = rng.randint(1, 30), rng.randint(1, 30), rng.randint(2, 9)
        rows.append({"question": f"What is ({a} + {b}) * {c}?", "answer": str((a + b) * c)})
    return rows


def load_environment(
    num_examples: int = 20,
    seed: int = 0,
    max_turns: int = 4,
    **kwargs: Any,
) -> vf.Environment:
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def correct_answer(completion: vf.Messages, answer: str, **_: Any) -> float:
        assistant = parser.get_assistant_messages(completion)
        if not assistant:
            return 0.0
        parsed = parser.parse_answer(assistant[-1:])
        return 1.0 if parsed is not None and parsed.strip() == answer else 0.0

    def used_tools(completion: vf.Messages, **_: Any) -> float:
        return 1.0 if parser.get_tool_messages(completion) else 0.0

    rubric = vf.Rubric(funcs=[correct_answer, used_tools], weights=[1.0, 0.2], parser=parser)
    return vf.ToolEnv(
        tools=[add, multiply],
        max_turns=max_turns,
        eval_dataset=Dataset.from_list(build_rows(num_examples, seed=seed)),
        system_prompt=SYSTEM_PROMPT,
        parser=parser,
        rubric=rubric,
        **kwargs,
    )
