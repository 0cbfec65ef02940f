"""lucky_digit: reply with the asked digit and stop (a GRPO toy task).

The right answer depends on the prompt: by default the prompts ask for 0 or 1 in
turn. Full reward needs the right answer *and* a stop: the reply is exactly the
asked digit (spaces aside) and the model ended it itself, not ``max_tokens``
(``answered``, 0.5). Two shaping terms make it learnable from random weights in
minutes on a CPU: the reply starts with the asked digit (0.3), and the model
stopped a non-empty reply (0.2, the format). So ``1`` and a stop scores 1.0,
``1111`` cut off by ``max_tokens`` 0.3, ``10`` and a stop 0.5, ``0`` and a stop 0.2;
a policy that ignores the prompt scores at most 0.6 (``0`` and a stop on every
prompt: 1.0 and 0.2 in turn). Random completions already differ in the shaping
terms within a group, so group-relative advantages have a signal from the first
step. Prompts are generated locally with a seeded RNG; the train and eval splits
use different phrasings and different filler words, so the held-out eval measures
prompts the policy never trained on.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import vfops

SYSTEM_PROMPT = "Reply with the digit only."

# Varied phrasings, the digit at different places: the policy learns to find the
# digit, not where one template puts it (the held-out templates are new to it).
TRAIN_TEMPLATES = (
    "Say the digit {d}. ({w})",
    "Write {d} now, {w}.",
    "Digit {d} please: {w}",
    "{w}, then reply {d}.",
    "The {w} wants {d}.",
    "Reply {d} ({w})",
)
EVAL_TEMPLATES = (
    "Give me the digit {d} ({w})",
    "{w}: answer with {d}.",
)
TRAIN_WORDS = ("apple", "river", "stone", "cloud", "green", "table", "light", "music")
EVAL_WORDS = ("ocean", "policy", "token", "batch", "score", "model")


ANSWER_WEIGHT = 0.5
"""The strict answer's share of the reward; the shaping terms share the rest."""
FIRST_WEIGHT = 0.3
STOP_WEIGHT = 0.2


def _reply(completion: list[dict[str, Any]]) -> str:
    return "".join(str(m.get("content") or "") for m in completion if m.get("role") == "assistant")


def _stopped(state: dict[str, Any]) -> bool:
    """The model ended its reply itself (cut off by ``max_tokens``: ``stop_reason`` "length")."""
    return state.get("stop_reason", "completed") != "length"


def answered(
    completion: list[dict[str, Any]], info: dict[str, Any], state: dict[str, Any]
) -> float:
    """1.0 when the reply is exactly the asked digit (spaces aside) and the model stopped."""
    return float(_stopped(state) and "".join(_reply(completion).split()) == str(info["digit"]))


def starts_with_the_digit(completion: list[dict[str, Any]], info: dict[str, Any]) -> float:
    """1.0 when the reply's first non-space character is the asked digit."""
    return float("".join(_reply(completion).split())[:1] == str(info["digit"]))


def digit_fraction(completion: list[dict[str, Any]], info: dict[str, Any]) -> float:
    """Fraction of the reply's non-space characters that are the asked digit (0 when empty)."""
    visible = [c for c in _reply(completion) if not c.isspace()]
    if not visible:
        return 0.0
    return sum(1 for c in visible if c == str(info["digit"])) / len(visible)


def stopped(completion: list[dict[str, Any]], state: dict[str, Any]) -> float:
    """1.0 when the model ended a non-empty reply itself: the format, whatever it says."""
    return float(_stopped(state) and bool(_reply(completion).strip()))


def build_dataset(num_examples: int, *, digits: str, seed: int, split: str) -> list[dict[str, Any]]:
    """``num_examples`` prompts; the same (split, seed) always gives the same rows."""
    rng = random.Random(f"lucky_digit:{split}:{seed}")
    templates = TRAIN_TEMPLATES if split == "train" else EVAL_TEMPLATES
    words = TRAIN_WORDS if split == "train" else EVAL_WORDS
    rows: list[dict[str, Any]] = []
    for index in range(num_examples):
        # digits in turn, not drawn: every step's prompts ask for each digit equally
        # often, so "always say 0" earns nothing over "say what is asked"
        digit = digits[index % len(digits)]
        question = rng.choice(templates).format(d=digit, w=rng.choice(words))
        rows.append({"question": question, "answer": digit, "info": {"digit": digit}})
    return rows


# The reward kinds load_environment offers: (function, weight) each.
REWARDS: dict[str, list[tuple[Callable[..., float], float]]] = {
    "strict": [
        (answered, ANSWER_WEIGHT),
        (starts_with_the_digit, FIRST_WEIGHT),
        (stopped, STOP_WEIGHT),
    ],
    "dense": [(digit_fraction, 1.0)],
}


def load_environment(
    digits: str = "01",
    num_train_examples: int = 256,
    num_examples: int = 64,
    seed: int = 0,
    max_tokens: int = 8,
    reward: str = "strict",
) -> vfops.Environment:
    """Build the environment.

    Args:
        digits: Digits the prompts ask for, in turn (``"01"``: a prompt-blind policy
            scores at most 0.6; ``"7"``: always 7, no need to read the prompt).
        num_train_examples: Rows of the train split.
        num_examples: Rows of the eval split (held-out phrasings and words).
        seed: Seed of the prompt generator.
        max_tokens: Default ``max_tokens`` per reply.
        reward: ``"strict"``: the answer and a stop (``answered`` 0.5,
            ``starts_with_the_digit`` 0.3, ``stopped`` 0.2). ``"dense"``: ``digit_fraction``
            alone, stopped or not (1.0 for ``1111`` cut off): random completions' rewards
            differ in every group, which a trainer test of a step or two needs.
    """
    if not digits or not all(c.isdigit() for c in digits):
        raise ValueError(f"digits must be a non-empty string of 0-9, got {digits!r}")
    if num_train_examples < 1 or num_examples < 1:
        raise ValueError("num_train_examples and num_examples must be positive")
    if reward not in REWARDS:
        raise ValueError(f"reward must be one of {sorted(REWARDS)}, got {reward!r}")
    funcs, weights = zip(*REWARDS[reward], strict=True)
    return vfops.SingleTurnEnv(
        dataset=lambda: build_dataset(num_train_examples, digits=digits, seed=seed, split="train"),
        eval_dataset=lambda: build_dataset(num_examples, digits=digits, seed=seed, split="eval"),
        system_prompt=SYSTEM_PROMPT,
        rubric=vfops.Rubric(funcs=funcs, weights=weights),
        sampling_args={"max_tokens": max_tokens},
        name="lucky_digit",
    )
