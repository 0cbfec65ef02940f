"""lucky_digit's data and reward (no model needed)."""

from __future__ import annotations

import asyncio

import lucky_digit
import pytest

from vfops.clients import ChatResponse, ScriptedClient
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


STOPPED = {"stop_reason": "completed"}
CUT_OFF = {"stop_reason": "length"}


@pytest.mark.parametrize(
    ("reply", "state", "reward"),
    [
        ("7", STOPPED, 1.0),
        (" 7\n", STOPPED, 1.0),
        ("7", CUT_OFF, 0.3),  # the right digit, but max_tokens ended it
        ("7777", CUT_OFF, 0.3),  # the demo's old reward hack: repeat until cut off
        ("77", STOPPED, 0.5),  # stopped, starts right, not the answer
        ("7a", STOPPED, 0.5),
        ("3", STOPPED, 0.2),  # the format alone
        ("37", CUT_OFF, 0.0),
        ("", STOPPED, 0.0),  # an empty reply earns nothing, not even the format
        ("abc", CUT_OFF, 0.0),
    ],
)
def test_full_reward_needs_the_answer_and_a_stop(
    reply: str, state: dict[str, str], reward: float
) -> None:
    completion = [{"role": "assistant", "content": reply}]
    info = {"digit": "7"}
    total = (
        lucky_digit.ANSWER_WEIGHT * lucky_digit.answered(completion, info, state)
        + lucky_digit.FIRST_WEIGHT * lucky_digit.starts_with_the_digit(completion, info)
        + lucky_digit.STOP_WEIGHT * lucky_digit.stopped(completion, state)
    )
    assert total == pytest.approx(reward)


def test_rollout_with_a_scripted_client() -> None:
    """The rubric reads the stop from the rollout: the same text scores 1.0 when the model
    stopped and 0.3 when ``max_tokens`` cut it off."""
    env = lucky_digit.load_environment(digits="7", num_examples=2)
    example = next(iter(env.iter_eval_examples(1)))
    cut_off = ChatResponse(
        message={"role": "assistant", "content": "7"},
        finish_reason="length",
        prompt_tokens=5,
        completion_tokens=8,
    )
    client = ScriptedClient(["7", cut_off, "x7"])

    async def run() -> list[float | None]:
        records = await env.run_group(client, "m", example, [0, 1, 2])
        return [r.reward for r in records]

    assert sorted(r or 0.0 for r in asyncio.run(run())) == pytest.approx([0.2, 0.3, 1.0])


@pytest.mark.parametrize("split", ["train", "eval"])
def test_a_reply_that_ignores_the_prompt_scores_at_most_0_6(split: str) -> None:
    """The default task is prompt-conditional: the digits are asked for in turn, so
    whatever constant reply a policy gives, its mean reward is at most 0.6 (the right
    digit and a stop on half the prompts, the format alone on the others)."""
    env = lucky_digit.load_environment()
    rows = env.get_dataset() if split == "train" else env.get_eval_dataset()
    asked = list(rows["answer"])
    infos = [{"digit": digit} for digit in asked]
    assert sorted(set(asked)) == ["0", "1"] and asked.count("0") == asked.count("1")
    env_rubric = env.rubric
    means = {}
    for reply in ("0", "1", "01", "0011", "x"):
        completion = [{"role": "assistant", "content": reply}]
        states = [
            {"prompt": [], "completion": completion, "info": i, "stop_reason": "completed"}
            for i in infos
        ]
        scores = asyncio.run(env_rubric.score_group(states))
        means[reply] = sum(s.reward or 0.0 for s in scores) / len(scores)
    assert max(means.values()) == pytest.approx(0.6), means


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="digits"):
        lucky_digit.load_environment(digits="x")


def test_the_dense_reward_pays_any_share_of_the_digit_stopped_or_not() -> None:
    env = lucky_digit.load_environment(digits="7", reward="dense")
    states = [
        {"prompt": [], "completion": [{"role": "assistant", "content": c}],
         "info": {"digit": "7"}, "stop_reason": "length"}
        for c in ("7777", "7a", "x")
    ]  # fmt: skip
    scores = asyncio.run(env.rubric.score_group(states))
    assert [s.reward for s in scores] == [1.0, 0.5, 0.0]
    with pytest.raises(ValueError, match="reward must be"):
        lucky_digit.load_environment(reward="lenient")
