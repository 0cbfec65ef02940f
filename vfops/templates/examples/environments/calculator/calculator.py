"""calculator: multi-step word problems solved with a ``calculate`` tool.

The model calls ``calculate(expression)`` through native tool calls and gives
its final number inside ``<answer>...</answer>``. The tool evaluates
expressions by walking the Python AST with an allow-list (numbers, ``+ - * /
**``, parentheses, unary minus): it never calls ``eval``. Problems are
generated locally with a seeded RNG (no download).
"""

from __future__ import annotations

import ast
import math
import operator
import random
import re
from collections.abc import Callable
from typing import Any

import vfops

SYSTEM_PROMPT = (
    "Solve the word problem. Use the calculate tool for every arithmetic step. "
    "When you are done, reply with only the final number inside <answer>...</answer>."
)

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 100
MAX_MAGNITUDE = 10**100

_BINARY_OPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY_OPS: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_OP_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}


# --- the tool -------------------------------------------------------------------------
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Supports numbers, the operators + - * / ** (power), parentheses and unary minus.
    Names, function calls and anything else are rejected.

    Args:
        expression: The expression to evaluate, for example "(12 + 3) * 4 - 2 ** 3".

    Returns:
        The result as a string: an integer when the result is whole, else a decimal.

    Raises:
        ValueError: The expression is not valid arithmetic, or cannot be computed
            (division by zero, a result too large).
    """
    return format_number(evaluate(expression))


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic ``expression`` (see :func:`calculate`)."""
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    if not expression.strip():
        raise ValueError("expression is empty")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"invalid syntax in {expression!r}: {exc.msg}") from None
    return _eval_node(tree.body)


def _eval_node(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"only numbers are allowed, not {type(value).__name__} {value!r:.40}")
        return value
    if isinstance(node, ast.BinOp):
        func = _BINARY_OPS.get(type(node.op))
        if func is None:
            raise ValueError(
                f"operator {type(node.op).__name__} is not allowed; use + - * / ** only"
            )
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        try:
            result = func(left, right)
        except ZeroDivisionError:  # 0 ** -1
            raise ValueError("division by zero") from None
        except OverflowError:
            raise ValueError("result is too large") from None
        return _checked(result)
    if isinstance(node, ast.UnaryOp):
        func = _UNARY_OPS.get(type(node.op))
        if func is None:
            raise ValueError(
                f"unary operator {type(node.op).__name__} is not allowed; only - and + are"
            )
        return _checked(func(_eval_node(node.operand)))
    if isinstance(node, ast.Name):
        raise ValueError(f"names are not allowed (got {node.id!r}); use numbers only")
    if isinstance(node, ast.Call):
        raise ValueError("function calls are not allowed; use numbers and + - * / ** only")
    if isinstance(node, ast.Attribute):
        raise ValueError(f"attribute access is not allowed (got .{node.attr})")
    raise ValueError(f"{type(node).__name__} is not allowed; use numbers and + - * / ** only")


def _checked(value: Any) -> int | float:
    if isinstance(value, complex):  # (-8) ** 0.5
        raise ValueError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("result is too large")
    if abs(value) > MAX_MAGNITUDE:
        raise ValueError(f"result is too large (more than {MAX_MAGNITUDE:.0e} in magnitude)")
    return value  # type: ignore[no-any-return]


def format_number(value: int | float) -> str:
    """``6.0`` -> ``"6"``, ``3.5`` -> ``"3.5"``, ``1/3`` -> ``"0.333333333333"``."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.12g}"
    return str(value)


# --- the problems -----------------------------------------------------------------------
def _shop(rng: random.Random) -> tuple[str, str]:
    price, a, b = rng.randint(12, 95), rng.randint(3, 19), rng.randint(3, 19)
    question = (
        f"Pencils cost {price} cents each. Maya buys {a} pencils and Leo buys {b} pencils. "
        "How many cents do they spend in total?"
    )
    return question, f"{price} * ({a} + {b})"


def _train(rng: random.Random) -> tuple[str, str]:
    v1, h1 = rng.randint(40, 140), rng.randint(2, 9)
    v2, h2 = rng.randint(40, 140), rng.randint(2, 9)
    question = (
        f"A train travels at {v1} km/h for {h1} hours, then at {v2} km/h for {h2} hours. "
        "How many kilometres does it travel in total?"
    )
    return question, f"{v1} * {h1} + {v2} * {h2}"


def _marbles(rng: random.Random) -> tuple[str, str]:
    start, bags, per_bag = rng.randint(10, 99), rng.randint(2, 12), rng.randint(6, 30)
    given = rng.randint(1, start)
    question = (
        f"Sam has {start} marbles. He buys {bags} bags with {per_bag} marbles each, "
        f"then gives {given} marbles to his sister. How many marbles does he have now?"
    )
    return question, f"{start} + {bags} * {per_bag} - {given}"


def _bill(rng: random.Random) -> tuple[str, str]:
    friends = rng.randint(3, 8)
    share = rng.randint(12, 60)
    tip = rng.randint(2, 9)
    total = friends * share
    question = (
        f"{friends} friends split a restaurant bill of {total} dollars equally, and each "
        f"of them also leaves a {tip} dollar tip. How many dollars does each friend pay?"
    )
    return question, f"{total} / {friends} + {tip}"


def _garden(rng: random.Random) -> tuple[str, str]:
    width, length, side = rng.randint(8, 40), rng.randint(8, 40), rng.randint(2, 7)
    question = (
        f"A garden is {width} m wide and {length} m long. A square pond with sides of "
        f"{side} m is dug in it. How many square metres of garden are left?"
    )
    return question, f"{width} * {length} - {side} ** 2"


def _average(rng: random.Random) -> tuple[str, str]:
    scores = [rng.randint(50, 100) for _ in range(4)]
    question = (
        f"A student scores {scores[0]}, {scores[1]}, {scores[2]} and {scores[3]} on four "
        "tests. What is the average score?"
    )
    return question, f"({' + '.join(map(str, scores))}) / 4"


def _savings(rng: random.Random) -> tuple[str, str]:
    weekly, weeks, price = rng.randint(15, 60), rng.randint(5, 20), rng.randint(40, 200)
    question = (
        f"Ana saves {weekly} dollars a week for {weeks} weeks, then buys a bike for "
        f"{price} dollars. How many dollars does she have left?"
    )
    return question, f"{weekly} * {weeks} - {price}"


PROBLEMS: tuple[Callable[[random.Random], tuple[str, str]], ...] = (
    _shop,
    _train,
    _marbles,
    _bill,
    _garden,
    _average,
    _savings,
)


def build_dataset(num_examples: int, *, seed: int = 0, split: str = "eval") -> list[dict[str, Any]]:
    """Word problems; the answer is computed with :func:`evaluate` of the hidden expression."""
    rng = random.Random(f"calculator:{split}:{seed}")
    rows: list[dict[str, Any]] = []
    for _ in range(num_examples):
        make = rng.choice(PROBLEMS)
        question, expression = make(rng)
        rows.append(
            {
                "question": question,
                "answer": format_number(evaluate(expression)),
                "info": {"expression": expression, "kind": make.__name__.lstrip("_")},
            }
        )
    return rows


# --- the rubric -------------------------------------------------------------------------
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")


def parse_number(text: str | None) -> float | None:
    """The last number in ``text`` (``"about 1,250.5 km"`` -> 1250.5), or None."""
    if not text:
        return None
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    return float(matches[-1].replace(",", ""))


def make_correct_answer(rel_tol: float, abs_tol: float) -> Callable[..., float]:
    def correct_answer(completion: list[dict[str, Any]], answer: str, parser: Any) -> float:
        """1.0 when the number in <answer> matches the reference within the tolerance."""
        got = parse_number(parser.parse_answer(completion))
        if got is None:
            return 0.0
        expected = float(answer)
        return 1.0 if math.isclose(got, expected, rel_tol=rel_tol, abs_tol=abs_tol) else 0.0

    return correct_answer


def used_calculator(state: dict[str, Any]) -> float:
    """1.0 when the rollout made at least one tool call that did not fail."""
    stats = state.get("tool_stats") or {}
    return 1.0 if stats.get("calls", 0) - stats.get("errors", 0) > 0 else 0.0


def load_environment(
    num_examples: int = 200,
    num_train_examples: int = 1000,
    seed: int = 0,
    max_turns: int = 8,
    rel_tol: float = 1e-4,
    abs_tol: float = 1e-6,
    tool_use_weight: float = 0.1,
    max_tokens: int | None = 512,
    system_prompt: str = SYSTEM_PROMPT,
) -> vfops.Environment:
    """Build the calculator tool-use environment.

    Args:
        num_examples: Problems in the eval split.
        num_train_examples: Problems in the train split (0 for none).
        seed: Seed of the problem generator.
        max_turns: Most assistant turns (tool-calling turns included).
        rel_tol: Relative tolerance of the numeric match.
        abs_tol: Absolute tolerance of the numeric match.
        tool_use_weight: Weight of ``used_calculator`` (1.0 when a tool call succeeded).
        max_tokens: Default ``max_tokens`` per turn (None for the server's default).
        system_prompt: The system prompt.
    """
    if num_examples < 1 or num_train_examples < 0:
        raise ValueError("num_examples must be positive and num_train_examples non-negative")
    parser = vfops.XMLParser(["think", "answer"])
    rubric = vfops.Rubric(parser=parser)
    rubric.add_reward_func(make_correct_answer(rel_tol, abs_tol), weight=1.0)
    rubric.add_reward_func(used_calculator, weight=tool_use_weight)
    rubric.add_metric(parser.get_format_reward_func())
    return vfops.ToolEnv(
        tools=[calculate],
        dataset=(
            (lambda: build_dataset(num_train_examples, seed=seed, split="train"))
            if num_train_examples
            else None
        ),
        eval_dataset=lambda: build_dataset(num_examples, seed=seed, split="eval"),
        system_prompt=system_prompt,
        parser=parser,
        rubric=rubric,
        max_turns=max_turns,
        sampling_args={"max_tokens": max_tokens} if max_tokens else None,
        name="calculator",
    )
