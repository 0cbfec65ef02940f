"""reverse_text: reverse a short text, character by character, graded by how close.

Each prompt is a few common words drawn with a seeded RNG (train and eval splits from
differently seeded generators, so the held-out eval asks for texts the policy never
trained on). The reward is the longest-common-subsequence ratio between the reply and
the reversed text (``difflib.SequenceMatcher``: 2 * matches / total length, in [0, 1]):
every reply earns partial credit, so the rollouts of a group differ from the first step
and group-relative advantages have a signal. A chatty reply ("The reversed text is:
...") scores less than the bare reversal, a half-right reversal more than an echo of
the text. Nothing is downloaded: the words are listed here.
"""

from __future__ import annotations

import difflib
import random
from typing import Any

import vfops

SYSTEM_PROMPT = "Reverse the given text character by character. Reply with the reversed text only."

WORDS = (
    "apple", "river", "stone", "cloud", "green", "table", "light", "music", "ocean",
    "paper", "house", "train", "plant", "bread", "chair", "dream", "earth", "field",
    "glass", "heart", "horse", "lemon", "money", "night", "piano", "queen", "radio",
    "sheep", "smile", "storm", "sugar", "tiger", "water", "wheel", "world", "bird",
    "book", "cake", "door", "fish", "gold", "hill", "king", "lake", "milk", "moon",
    "rain", "road", "ship", "snow", "star", "tree", "wind", "wolf", "blue", "cold",
    "dark", "fast", "good", "kind", "long", "red", "sun", "sea", "cat", "dog", "sky",
)  # fmt: skip


def reply_text(completion: list[dict[str, Any]]) -> str:
    return "".join(str(m.get("content") or "") for m in completion if m.get("role") == "assistant")


def lcs_ratio(completion: list[dict[str, Any]], answer: str) -> float:
    """``SequenceMatcher(None, reply, reversed text).ratio()`` of the stripped reply."""
    return difflib.SequenceMatcher(None, reply_text(completion).strip(), answer).ratio()


def build_dataset(
    num_examples: int, *, min_words: int, max_words: int, seed: int, split: str
) -> list[dict[str, Any]]:
    """``num_examples`` texts of ``min_words``..``max_words`` words; the same (split,
    seed) always gives the same rows."""
    rng = random.Random(f"reverse_text:{split}:{seed}")
    rows: list[dict[str, Any]] = []
    for _ in range(num_examples):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words)))
        rows.append({"question": text, "answer": text[::-1], "info": {"text": text}})
    return rows


def load_environment(
    num_examples: int = 200,
    num_train_examples: int = 2000,
    min_words: int = 1,
    max_words: int = 3,
    seed: int = 0,
    max_tokens: int = 32,
    system_prompt: str = SYSTEM_PROMPT,
) -> vfops.Environment:
    """Build the environment.

    Args:
        num_examples: Rows of the eval split (the held-out prompts).
        num_train_examples: Rows of the train split.
        min_words: Fewest words in a text.
        max_words: Most words in a text.
        seed: Seed of the text generator.
        max_tokens: Default ``max_tokens`` sampling argument.
        system_prompt: The system prompt.
    """
    if num_examples < 1 or num_train_examples < 0:
        raise ValueError("num_examples must be positive and num_train_examples non-negative")
    if not 1 <= min_words <= max_words:
        raise ValueError(f"need 1 <= min_words <= max_words, got {min_words} and {max_words}")
    shape = {"min_words": min_words, "max_words": max_words, "seed": seed}
    return vfops.SingleTurnEnv(
        dataset=(
            (lambda: build_dataset(num_train_examples, split="train", **shape))
            if num_train_examples
            else None
        ),
        eval_dataset=lambda: build_dataset(num_examples, split="eval", **shape),
        system_prompt=system_prompt,
        rubric=vfops.Rubric([lcs_ratio]),
        sampling_args={"max_tokens": max_tokens},
    )
