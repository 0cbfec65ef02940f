"""lucky_digit's data and reward (no model needed)."""

from __future__ import annotations

import asyncio

import lucky_digit
import pytest

from vfops.clients import ScriptedClient
from vfops.envs import load_environment


def _questions(env: object, split: str) -> list[str]:
    data = env.get_dataset() if split == "train" else env.get_eval_dataset()  # type: ignore[attr-defined]
    return [p[-1]["content"] for p in data["prompt"]]


def test_entry_point_and_held_out_split() -> None:
    env = load_environment("lucky_digit")
    assert env.name == "lucky_digit"
    train, held_out = _questions(env, "train"), _questions(env, "eval")
    assert len(train) == 256 and len(held_out) == 64
    assert not set(train) & set(held_out)
    assert all(w not in q for q in held_out for w in lucky_digit.TRAIN_WORDS)


def test_deterministic_per_seed() -> None:
    a = lucky_digit.load_environment(digits="0123456789", seed=1)
    b = lucky_digit.load_environment(digits="0123456789", seed=1)
    c = lucky_digit.load_environment(digits="0123456789", seed=2)
    assert _questions(a, "train") == _questions(b, "train") != _questions(c, "train")


@pytest.mark.parametrize(
    ("reply", "reward"), [("7", 1.0), ("7 7 77", 1.0), ("7a", 0.5), ("abc", 0.0), ("", 0.0)]
)
def test_reward_is_the_fraction_of_the_digit(reply: str, reward: float) -> None:
    completion = [{"role": "assistant", "content": reply}]
    assert lucky_digit.digit_fraction(completion, {"digit": "7"}) == reward


def test_rollout_with_a_scripted_client() -> None:
    env = lucky_digit.load_environment(digits="7", num_examples=2)
    example = next(iter(env.iter_eval_examples(1)))
    client = ScriptedClient(["777", "x7"])

    async def run() -> list[float | None]:
        records = await env.run_group(client, "m", example, [0, 1])
        return [r.reward for r in records]

    assert sorted(r or 0.0 for r in asyncio.run(run())) == [0.5, 1.0]


@pytest.mark.parametrize("split", ["train", "eval"])
def test_a_reply_that_ignores_the_prompt_scores_at_most_half(split: str) -> None:
    """The default task is prompt-conditional: the digits are asked for in turn, so
    whatever constant reply a policy gives, its mean reward is at most 0.5."""
    env = lucky_digit.load_environment()
    rows = env.get_dataset() if split == "train" else env.get_eval_dataset()
    asked = list(rows["answer"])
    infos = [{"digit": digit} for digit in asked]
    assert sorted(set(asked)) == ["0", "1"] and asked.count("0") == asked.count("1")
    for reply in ("0", "1", "01", "0011", "x"):
        completion = [{"role": "assistant", "content": reply}]
        mean = sum(lucky_digit.digit_fraction(completion, i) for i in infos) / len(infos)
        assert mean <= 0.5, (reply, mean)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="digits"):
        lucky_digit.load_environment(digits="x")
