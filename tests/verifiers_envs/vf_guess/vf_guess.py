"""vf_guess: a multi-turn ``verifiers`` environment (vfops test material).

The model guesses a secret integer from 1 to 16 (the row's ``answer``), one
``<guess>N</guess>`` per turn; ``env_response`` answers ``higher`` or ``lower``
(or asks for the format). The rollout ends when the guess is right or at
``max_turns`` (default 6; MultiTurnEnv's own ``max_turns_reached``).

How a right guess ends the rollout (``stop_mode``):

- ``"stop_decorator"`` (default): a ``@vf.stop`` method, ``guessed_correctly``,
  checks the last guess before ``env_response`` runs again, so the completion
  ends with the model's right guess and ``stop_condition`` is
  ``"guessed_correctly"``.
- ``"final_env_response"``: ``env_response`` answers ``correct`` and stores that
  reply in ``state["final_env_response"]``; MultiTurnEnv's
  ``has_final_env_response`` stops the rollout without another model call and
  the ``correct`` message is appended to the completion.

Rubric (separate functions, so each shows up as a metric): ``solved`` (weight
1.0) and ``speed_bonus`` (weight 0.2: ``(max_turns - turns) / (max_turns - 1)``
when solved, else 0), plus MultiTurnEnv's ``num_turns`` metric (weight 0).
"""

from __future__ import annotations

import random
from typing import Any, Literal

import verifiers as vf
from datasets import Dataset

LOW, HIGH = 1, 16
SYSTEM_PROMPT = (
    f"You are playing a number guessing game. I picked a secret integer from {LOW} to "
    f"{HIGH}. Reply with exactly one guess as <guess>N</guess>. After each guess I "
    "answer 'higher', 'lower' or 'correct'."
)
FORMAT_HINT = f"Reply with your guess as <guess>N</guess>, N from {LOW} to {HIGH}."

StopMode = Literal["stop_decorator", "final_env_response"]


def build_rows(num_examples: int, *, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(f"vf_guess:{seed}")
    return [
        {
            "question": f"Game {i + 1}: guess my secret integer from {LOW} to {HIGH}.",
            "answer": str(rng.randint(LOW, HIGH)),
        }
        for i in range(num_examples)
    ]


def parse_guess(parser: vf.XMLParser, messages: vf.Messages) -> int | None:
    """The last assistant message's ``<guess>`` as an int (None when absent)."""
    text = parser.parse_answer(messages)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


class GuessEnv(vf.MultiTurnEnv):
    def __init__(self, stop_mode: StopMode = "stop_decorator", **kwargs: Any) -> None:
        if stop_mode not in ("stop_decorator", "final_env_response"):
            raise ValueError(f"unknown stop_mode {stop_mode!r}")
        self.stop_mode = stop_mode
        super().__init__(**kwargs)

    def _last_guess(self, state: vf.State) -> int | None:
        if not state["trajectory"]:
            return None
        return parse_guess(self.parser, state["trajectory"][-1]["completion"])

    @vf.stop
    async def guessed_correctly(self, state: vf.State) -> bool:
        if self.stop_mode != "stop_decorator":
            return False
        guess = self._last_guess(state)
        return guess is not None and guess == int(state["answer"])

    async def env_response(
        self, messages: vf.Messages, state: vf.State, **kwargs: Any
    ) -> vf.Messages:
        guess = parse_guess(self.parser, messages)
        secret = int(state["answer"])
        if guess is None:
            text = FORMAT_HINT
        elif guess < secret:
            text = "higher"
        elif guess > secret:
            text = "lower"
        else:  # only reached with stop_mode="final_env_response"
            reply: vf.Messages = [vf.UserMessage(content="correct")]
            state["final_env_response"] = reply
            return reply
        return [vf.UserMessage(content=text)]


def load_environment(
    num_examples: int = 20,
    seed: int = 0,
    max_turns: int = 6,
    stop_mode: StopMode = "stop_decorator",
    num_train_examples: int = 0,
    **kwargs: Any,
) -> vf.Environment:
    """``num_train_examples`` > 0 adds a training split (other secrets) for trainers."""
    if max_turns < 2:
        raise ValueError("max_turns must be at least 2")
    parser = vf.XMLParser(["guess"], answer_field="guess")

    def solved(completion: vf.Messages, answer: str, **_: Any) -> float:
        guess = parse_guess(parser, completion)
        return 1.0 if guess is not None and guess == int(answer) else 0.0

    def speed_bonus(completion: vf.Messages, answer: str, state: vf.State, **_: Any) -> float:
        if not solved(completion, answer):
            return 0.0
        turns = len(state["trajectory"])
        return max(0.0, (max_turns - turns) / (max_turns - 1))

    rubric = vf.Rubric(funcs=[solved, speed_bonus], weights=[1.0, 0.2], parser=parser)
    return GuessEnv(
        stop_mode=stop_mode,
        eval_dataset=Dataset.from_list(build_rows(num_examples, seed=seed)),
        dataset=(
            Dataset.from_list(build_rows(num_train_examples, seed=seed + 1))
            if num_train_examples > 0
            else None
        ),
        system_prompt=SYSTEM_PROMPT,
        parser=parser,
        rubric=rubric,
        max_turns=max_turns,
        **kwargs,
    )
