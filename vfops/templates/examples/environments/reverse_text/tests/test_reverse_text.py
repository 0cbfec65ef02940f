"""reverse_text: deterministic splits and a graded reward."""

from __future__ import annotations

import pytest
import reverse_text

from vfops.envs import load_environment


def _reply(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_splits_are_deterministic_and_differ() -> None:
    shape = {"min_words": 1, "max_words": 3, "seed": 0}
    train = reverse_text.build_dataset(50, split="train", **shape)
    assert train == reverse_text.build_dataset(50, split="train", **shape)
    held_out = reverse_text.build_dataset(50, split="eval", **shape)
    assert [r["question"] for r in train] != [r["question"] for r in held_out]
    for row in held_out:
        assert row["answer"] == row["question"][::-1]
        assert 1 <= len(row["question"].split()) <= 3


def test_reward_is_graded_between_an_echo_and_the_reversal() -> None:
    answer = "apple river"[::-1]
    exact = reverse_text.lcs_ratio(_reply("  revir elppa\n"), answer)
    chatty = reverse_text.lcs_ratio(_reply("The reversed text is: revir elppa"), answer)
    echo = reverse_text.lcs_ratio(_reply("apple river"), answer)
    assert exact == 1.0
    assert echo < chatty < exact
    assert reverse_text.lcs_ratio(_reply(""), answer) == 0.0


def test_entry_point_and_arguments() -> None:
    env = load_environment("reverse_text", num_examples=7, min_words=2, max_words=2)
    rows = env.get_eval_dataset()
    assert len(rows) == 7
    with pytest.raises(ValueError, match="min_words"):
        reverse_text.load_environment(min_words=3, max_words=2)
