"""guess_number: a multi-turn game with environment feedback.

The model guesses a secret integer in ``[lo, hi]`` as ``<guess>N</guess>``; the
environment replies ``higher``, ``lower`` or ``invalid guess: ...``. The
rollout stops as soon as the secret is guessed, or after ``max_turns`` guesses.
Secrets are drawn locally with a seeded RNG (no download).
"""

from __future__ import annotations

import random
from typing import Any

import vfops

SYSTEM_PROMPT = (
    "You are playing a number-guessing game. Each turn, reply with exactly one guess "
    "as <guess>N</guess> (you may think first inside <think>...</think>). After each "
    "guess you are told whether the secret number is higher or lower."
)

State = dict[str, Any]
Messages = list[dict[str, Any]]


def build_dataset(
    num_examples: int, *, lo: int, hi: int, seed: int = 0, split: str = "eval"
) -> list[dict[str, Any]]:
    """One game per row: the secret is the row's ``answer``, the range is in ``info``."""
    rng = random.Random(f"guess_number:{split}:{seed}")
    rows = [
        {
            "question": (
                f"I am thinking of an integer between {lo} and {hi} (inclusive). "
                "Guess it in as few turns as you can. Reply with <guess>N</guess>."
            ),
            "answer": str(rng.randint(lo, hi)),
            "info": {"lo": lo, "hi": hi},
        }
        for _ in range(num_examples)
    ]
    return rows


class GuessNumberEnv(vfops.MultiTurnEnv):
    """Judges each guess; ``is_completed`` stops the rollout when it is right.

    Per-rollout state: ``guesses`` (valid guesses, in order), ``invalid_guesses``
    (count), ``solved`` (bool) and ``feedback`` (the reply to the last guess).
    """

    def __init__(self, *, parser: vfops.XMLParser, **kwargs: Any) -> None:
        super().__init__(parser=parser, **kwargs)
        self.guess_parser = parser

    async def setup_state(self, state: State) -> State:
        info = state.get("info") or {}
        state["lo"] = int(info.get("lo", 1))
        state["hi"] = int(info.get("hi", 100))
        state["secret"] = int(state["answer"])
        state["guesses"] = []
        state["invalid_guesses"] = 0
        state["solved"] = False
        state["feedback"] = ""
        return state

    def judge_guess(self, message: dict[str, Any] | str, state: State) -> str:
        """Record the guess of an assistant ``message``; return the feedback for the model."""
        raw = self.guess_parser.parse_answer(message if isinstance(message, str) else [message])
        if raw is None:
            state["invalid_guesses"] += 1
            return "invalid guess: no <guess>N</guess> tag found; reply like <guess>50</guess>"
        try:
            guess = int(raw.strip())
        except ValueError:
            state["invalid_guesses"] += 1
            return f"invalid guess: {raw.strip()[:40]!r} is not an integer"
        lo, hi = state["lo"], state["hi"]
        if not lo <= guess <= hi:
            state["invalid_guesses"] += 1
            return f"invalid guess: {guess} is outside [{lo}, {hi}]"
        state["guesses"].append(guess)
        if guess == state["secret"]:
            state["solved"] = True
            return f"correct! the number was {guess}"
        return "higher" if state["secret"] > guess else "lower"

    async def is_completed(self, messages: Messages, state: State) -> bool:
        last = messages[-1]
        if last.get("role") == "assistant":
            state["feedback"] = self.judge_guess(last, state)
        return bool(state["solved"]) or await super().is_completed(messages, state)

    async def env_response(self, messages: Messages, state: State) -> Messages:
        turns_left = self.max_turns - state["turn"] if self.max_turns > 0 else None
        if turns_left is None:
            suffix = ""
        else:
            suffix = f" ({turns_left} {'guess' if turns_left == 1 else 'guesses'} left)"
        return [{"role": "user", "content": f"{state['feedback']}{suffix}"}]


def solved(state: State) -> float:
    """1.0 when the secret was guessed."""
    return 1.0 if state.get("solved") else 0.0


def make_efficiency_bonus(max_turns: int) -> Any:
    def efficiency_bonus(state: State) -> float:
        """When solved: 1.0 on the first guess, falling linearly to 1/max_turns on the last."""
        if not state.get("solved"):
            return 0.0
        turns = max(1, int(state.get("turn", 1)))
        if max_turns <= 0:
            return 1.0 / turns
        return max(0.0, (max_turns - turns + 1) / max_turns)

    return efficiency_bonus


def num_guesses(state: State) -> float:
    """Valid guesses made (metric)."""
    return float(len(state.get("guesses") or []))


def invalid_guesses(state: State) -> float:
    """Turns whose guess was missing, not an integer or out of range (metric)."""
    return float(state.get("invalid_guesses", 0))


def load_environment(
    num_examples: int = 200,
    num_train_examples: int = 1000,
    lo: int = 1,
    hi: int = 100,
    max_turns: int = 10,
    seed: int = 0,
    max_tokens: int | None = 256,
    system_prompt: str = SYSTEM_PROMPT,
) -> vfops.Environment:
    """Build the guess-the-number environment.

    Args:
        num_examples: Games in the eval split.
        num_train_examples: Games in the train split (0 for none).
        lo: Smallest possible secret.
        hi: Largest possible secret.
        max_turns: Most guesses per game (0 for no limit).
        seed: Seed of the secret generator.
        max_tokens: Default ``max_tokens`` per turn (None for the server's default).
        system_prompt: The system prompt.
    """
    if lo > hi:
        raise ValueError(f"lo must not exceed hi, got lo={lo} hi={hi}")
    if num_examples < 1 or num_train_examples < 0 or max_turns < 0:
        raise ValueError(
            "num_examples must be positive; num_train_examples and max_turns non-negative"
        )
    parser = vfops.XMLParser(["think", "guess"], answer_field="guess")
    rubric = vfops.Rubric(parser=parser)
    rubric.add_reward_func(solved, weight=1.0)
    rubric.add_reward_func(make_efficiency_bonus(max_turns), weight=0.5)
    rubric.add_reward_func(parser.get_format_reward_func(), weight=0.1)
    rubric.add_metric(num_guesses)
    rubric.add_metric(invalid_guesses)
    return GuessNumberEnv(
        dataset=(
            (lambda: build_dataset(num_train_examples, lo=lo, hi=hi, seed=seed, split="train"))
            if num_train_examples
            else None
        ),
        eval_dataset=lambda: build_dataset(num_examples, lo=lo, hi=hi, seed=seed, split="eval"),
        system_prompt=system_prompt,
        parser=parser,
        rubric=rubric,
        max_turns=max_turns,
        sampling_args={"max_tokens": max_tokens} if max_tokens else None,
        name="guess_number",
    )
