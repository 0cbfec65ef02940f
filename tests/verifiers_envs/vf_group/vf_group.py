"""vf_group: a ``vf.EnvGroup`` of two single-turn environments (vfops test material).

- ``math``: ``vf.SingleTurnEnv`` with ``vf.XMLParser(["think", "answer"])``; rows
  ``Calculate a op b.``; rubric ``math_correct`` (weight 1.0) plus the parser's
  ``format_reward_func`` (weight 0.2).
- ``upper``: ``vf.SingleTurnEnv`` with a plain ``vf.Parser``; rows ``Word: w``;
  rubric ``upper_exact`` (weight 1.0: the reply is exactly ``w`` in upper case)
  plus ``upper_ignoring_case`` (weight 0.5: the reply is ``w`` in any case).

EnvGroup concatenates the sub-environments' datasets in order (``math`` rows
first, then ``upper`` rows), renumbers ``example_id`` from 0 and routes each row
by ``info["env_id"]`` (the sub-environment's name), which picks both the rollout
and the rubric. With the default 5 rows each, examples 0-4 are ``math`` and 5-9
are ``upper``.
"""

from __future__ import annotations

import random
from typing import Any

import verifiers as vf
from datasets import Dataset

MATH_SYSTEM_PROMPT = (
    "Calculate the value. Put your reasoning inside <think>...</think> and the final "
    "integer inside <answer>...</answer>."
)
UPPER_SYSTEM_PROMPT = "Reply with the given word in upper case and nothing else."
WORDS = (
    "apple",
    "river",
    "stone",
    "cloud",
    "tiger",
    "piano",
    "maple",
    "ocean",
    "candle",
    "garden",
    "silver",
    "window",
)
OPS = ("+", "-", "*")


def _solve(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def math_rows(num_examples: int, *, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(f"vf_group:math:{seed}")
    rows: list[dict[str, Any]] = []
    for _ in range(num_examples):
        a, b, op = rng.randint(0, 12), rng.randint(0, 12), rng.choice(OPS)
        rows.append({"question": f"Calculate {a} {op} {b}.", "answer": str(_solve(a, op, b))})
    return rows


def upper_rows(num_examples: int, *, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(f"vf_group:upper:{seed}")
    words = [rng.choice(WORDS) for _ in range(num_examples)]
    return [{"question": f"Word: {w}", "answer": w.upper()} for w in words]


def _last_assistant_text(parser: vf.Parser, completion: vf.Messages) -> str:
    return (parser.parse_answer(completion) or "").strip()


def math_env(num_examples: int, seed: int) -> vf.Environment:
    parser = vf.XMLParser(["think", "answer"], answer_field="answer")

    def math_correct(completion: vf.Messages, answer: str, **_: Any) -> float:
        parsed = parser.parse_answer(completion)
        return 1.0 if parsed is not None and parsed.strip() == answer else 0.0

    rubric = vf.Rubric(parser=parser)
    rubric.add_reward_func(math_correct, weight=1.0)
    rubric.add_reward_func(parser.get_format_reward_func(), weight=0.2)
    return vf.SingleTurnEnv(
        eval_dataset=Dataset.from_list(math_rows(num_examples, seed=seed)),
        system_prompt=MATH_SYSTEM_PROMPT,
        parser=parser,
        rubric=rubric,
    )


def upper_env(num_examples: int, seed: int) -> vf.Environment:
    parser = vf.Parser()

    def upper_exact(completion: vf.Messages, answer: str, **_: Any) -> float:
        return 1.0 if _last_assistant_text(parser, completion) == answer else 0.0

    def upper_ignoring_case(completion: vf.Messages, answer: str, **_: Any) -> float:
        return 1.0 if _last_assistant_text(parser, completion).upper() == answer else 0.0

    rubric = vf.Rubric(funcs=[upper_exact, upper_ignoring_case], weights=[1.0, 0.5], parser=parser)
    return vf.SingleTurnEnv(
        eval_dataset=Dataset.from_list(upper_rows(num_examples, seed=seed)),
        system_prompt=UPPER_SYSTEM_PROMPT,
        parser=parser,
        rubric=rubric,
    )


def load_environment(
    num_examples_per_env: int = 5,
    seed: int = 0,
    **kwargs: Any,
) -> vf.Environment:
    return vf.EnvGroup(
        envs=[math_env(num_examples_per_env, seed), upper_env(num_examples_per_env, seed)],
        env_names=["math", "upper"],
        **kwargs,
    )
