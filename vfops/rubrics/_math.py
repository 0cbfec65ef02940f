"""Math answers graded by symbolic equivalence (math-verify)."""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import Any

from vfops._types import Messages
from vfops.parsers import MaybeThinkParser, Parser, extract_boxed_answer
from vfops.rubrics._rubric import Rubric

# math-verify bounds each parse/compare with signal.alarm, which only works in the
# main thread. Off the main thread (a Rubric runs sync reward functions in scoring
# threads) the timeout must be disabled (None) or every call fails; there the rubric's
# scoring_timeout_s bounds the call instead (a scoring error after it, and the thread
# is stopped at its next Python instruction: sympy is pure Python).
_TIMEOUT_S = 5


def _timeout() -> int | None:
    return _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=4096)
def _parse_cached(text: str, timeout: int | None) -> Any:
    # The gold answer repeats across the rollouts of a group: parse it once.
    return _parse(text, timeout)


def _parse(text: str, timeout: int | None) -> Any:
    from math_verify import parse

    # Wrapping in \boxed{} makes math-verify read the text as LaTeX ("2x+1" as 2x+1,
    # not the first number 2) and is what the extracted answer was written inside.
    return parse(f"\\boxed{{{text}}}", parsing_timeout=timeout)


def math_equivalent(answer: str, response: str) -> bool:
    """Whether ``response`` is mathematically equivalent to the gold ``answer``."""
    from math_verify import verify

    if not answer.strip() or not response.strip():
        return False
    timeout = _timeout()
    gold = _parse_cached(answer, timeout)
    target = _parse(response, timeout)
    if not gold or not target:
        return False
    return bool(verify(gold, target, timeout_seconds=timeout))


class MathRubric(Rubric):
    r"""``correct_answer``: 1.0 when the parsed response equals the answer symbolically.

    The default parser takes the last ``\boxed{...}`` after any think block. An
    unparseable response scores 0.0, a legitimate score rather than an error.
    """

    def __init__(
        self, parser: Parser | None = None, *, scoring_timeout_s: float | None = None
    ) -> None:
        super().__init__(
            parser=parser or MaybeThinkParser(extract_boxed_answer),
            scoring_timeout_s=scoring_timeout_s,
        )
        self.add_reward_func(self.correct_answer)

    def correct_answer(self, completion: Messages | str, answer: str, parser: Parser) -> float:
        response = parser.parse_answer(completion) or ""
        return 1.0 if math_equivalent(str(answer), response) else 0.0
