"""Tests of arithmetic's logic with a scripted client (no model, no network)."""

from __future__ import annotations

import re
from pathlib import Path

import arithmetic
import pytest

from vfops.clients import ScriptedClient
from vfops.envs import load_environment
from vfops.evaluation import EvalRequest, RunOptions, evaluate_async, iter_records
from vfops.testing._stub_server import arithmetic_reply

_EXPR = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")


def _questions(env: object) -> list[str]:
    return [e.prompt[-1]["content"] for e in env.iter_eval_examples()]  # type: ignore[attr-defined]


def test_dataset_is_deterministic_per_seed_and_split() -> None:
    a = arithmetic.load_environment(num_examples=20, num_train_examples=20, seed=3)
    b = arithmetic.load_environment(num_examples=20, num_train_examples=20, seed=3)
    c = arithmetic.load_environment(num_examples=20, num_train_examples=20, seed=4)
    assert _questions(a) == _questions(b)
    assert _questions(a) != _questions(c)
    assert list(a.get_eval_dataset()["answer"]) == list(b.get_eval_dataset()["answer"])
    train = a.get_dataset()
    assert len(train) == 20
    assert list(train["prompt"]) != list(a.get_eval_dataset()["prompt"])


def test_default_sizes_and_entry_point() -> None:
    env = load_environment("arithmetic")
    assert env.name == "arithmetic"
    assert len(env.get_eval_dataset()) == 1000
    assert len(env.get_dataset()) == 1000
    no_train = arithmetic.load_environment(num_examples=5, num_train_examples=0)
    assert no_train.dataset is None


def test_questions_have_a_op_b_and_correct_answers() -> None:
    env = arithmetic.load_environment(num_examples=200, max_operand=12, ops="+-*")
    seen_ops = set()
    for example in env.iter_eval_examples():
        assert example.prompt[0]["role"] == "system"
        assert "<answer>" in example.prompt[0]["content"]
        match = _EXPR.fullmatch(example.prompt[-1]["content"])
        assert match is not None
        a, op, b = int(match[1]), match[2], int(match[3])
        assert 0 <= a <= 12 and 0 <= b <= 12
        assert example.answer == str(arithmetic.solve(a, op, b))
        assert example.info == {"a": a, "op": op, "b": b}
        seen_ops.add(op)
    assert seen_ops == {"+", "-", "*"}


def test_difficulty_and_ops_arguments() -> None:
    easy = arithmetic.load_environment(num_examples=50, difficulty="easy", ops="+")
    for example in easy.iter_eval_examples():
        match = _EXPR.fullmatch(example.prompt[-1]["content"])
        assert match is not None and match[2] == "+"
        assert int(match[1]) <= 10 and int(match[3]) <= 10
    with pytest.raises(ValueError, match="difficulty"):
        arithmetic.load_environment(difficulty="impossible")
    with pytest.raises(ValueError, match="ops"):
        arithmetic.load_environment(ops="/")


@pytest.mark.parametrize(
    ("reply", "correct", "formatted"),
    [
        ("<think>3 * 4 = 12</think>\n<answer>12</answer>", 1.0, 1.0),
        ("<think>hmm</think><answer> 12 </answer>", 1.0, 1.0),
        ("<think>3 * 4</think>\n<answer>13</answer>", 0.0, 1.0),
        ("<answer>12</answer>", 1.0, 1.0),
        ("The answer is <answer>12</answer>", 1.0, 0.0),  # text outside the tags
        ("<think>3 * 4 = 12", 0.0, 0.0),  # unclosed, no answer
        ("12", 0.0, 0.0),
        ("<answer>twelve</answer>", 0.0, 1.0),
    ],
)
async def test_rewards_on_right_wrong_and_malformed(
    reply: str, correct: float, formatted: float
) -> None:
    env = arithmetic.load_environment(num_examples=1)
    example = next(iter(env.iter_eval_examples()))
    example.answer = "12"
    state = await env.rollout(ScriptedClient([reply]), "m", example)
    score = await env.rubric.score_rollout(state)
    assert score.metrics == {"correct_answer": correct, "format_reward": formatted}
    assert score.reward == pytest.approx(correct + 0.2 * formatted)


def test_normalise_integer() -> None:
    assert arithmetic.normalise_integer(" 1,234 ") == "1234"
    assert arithmetic.normalise_integer("-7") == "-7"
    assert arithmetic.normalise_integer("+07") == "7"
    assert arithmetic.normalise_integer("3.5") is None
    assert arithmetic.normalise_integer(None) is None


async def test_stub_server_replies_score_full_marks(tmp_path: Path) -> None:
    env = arithmetic.load_environment(num_examples=30, seed=1)
    client = ScriptedClient(lambda messages, tools: arithmetic_reply(messages[-1]["content"]))
    request = EvalRequest(
        env_name="arithmetic", model="scripted", num_examples=30, rollouts_per_example=2
    )
    result = await evaluate_async(
        request, RunOptions(output_root=tmp_path, registry=False), environment=env, client=client
    )
    assert result.status == "completed"
    assert result.summary.rollouts == 60
    assert result.summary.metrics["correct_answer"].mean == 1.0
    assert result.summary.reward.mean == pytest.approx(1.2)
    assert client.calls[0]["sampling_args"] == {"max_tokens": 256}
    records = list(iter_records(result.run_dir))
    assert len(records) == 60
    assert {r.stop_reason for r in records} == {"completed"}


async def test_eval_half_right(tmp_path: Path) -> None:
    env = arithmetic.load_environment(num_examples=4)
    examples = {e.prompt[-1]["content"]: e for e in env.iter_eval_examples()}

    def reply(messages: list[dict[str, str]], tools: object) -> str:
        example = examples[messages[-1]["content"]]
        value = example.answer if example.example_id % 2 == 0 else "nope"
        return f"<think>ok</think><answer>{value}</answer>"

    result = await evaluate_async(
        EvalRequest(
            env_name="arithmetic", model="scripted", num_examples=4, rollouts_per_example=1
        ),
        environment=env,
        client=ScriptedClient(reply),
        options=RunOptions(output_root=tmp_path, registry=False),
    )
    assert result.summary.rollouts == 4
    assert result.summary.metrics["correct_answer"].mean == pytest.approx(0.5)
    assert result.summary.metrics["format_reward"].mean == 1.0
