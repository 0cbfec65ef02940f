"""Tests of mixed's routing with a scripted client (no model, no network)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import mixed
import pytest

from vfops.clients import ScriptedClient
from vfops.envs import EnvGroup, load_environment
from vfops.evaluation import EvalRequest, RunOptions, evaluate_async, iter_records
from vfops.testing._stub_server import arithmetic_reply


def test_group_of_both_members_with_their_tasks() -> None:
    env = mixed.load_environment(num_examples=3, num_train_examples=2, seed=1)
    assert isinstance(env, EnvGroup)
    assert env.name == "mixed"
    assert list(env.envs) == ["arithmetic", "guess_number"]
    assert env.envs["guess_number"].max_turns == 10  # type: ignore[attr-defined]
    eval_rows = env.get_eval_dataset()
    assert Counter(eval_rows["task"]) == {"arithmetic": 3, "guess_number": 3}
    assert list(eval_rows["example_id"]) == list(range(6))
    assert Counter(env.get_dataset()["task"]) == {"arithmetic": 2, "guess_number": 2}


def test_member_arguments_and_determinism() -> None:
    env = load_environment(
        "mixed",
        num_examples=4,
        arithmetic_args={"ops": "+", "max_operand": 5},
        guess_number_args={"max_turns": 3, "num_examples": 2},
    )
    rows = list(env.iter_eval_examples())
    assert Counter(e.task for e in rows) == {"arithmetic": 4, "guess_number": 2}
    for example in rows:
        if example.task == "arithmetic":
            assert " + " in example.prompt[-1]["content"]
    assert env.envs["guess_number"].max_turns == 3  # type: ignore[attr-defined]
    again = mixed.load_environment(
        num_examples=4,
        arithmetic_args={"ops": "+", "max_operand": 5},
        guess_number_args={"max_turns": 3, "num_examples": 2},
    )
    assert [e.prompt for e in again.iter_eval_examples()] == [e.prompt for e in rows]
    assert [e.answer for e in again.iter_eval_examples()] == [e.answer for e in rows]


def _player(messages: list[dict[str, Any]], tools: object) -> str:
    """Answers arithmetic like the stub server; plays guess_number by binary search."""
    first_user = next(m["content"] for m in messages if m["role"] == "user")
    if first_user.startswith("What is"):
        return arithmetic_reply(first_user)
    lo, hi, last = 1, 100, None
    for message in messages:
        if message["role"] == "assistant":
            last = int(message["content"].removeprefix("<guess>").removesuffix("</guess>"))
        elif message["role"] == "user" and last is not None:
            if message["content"].startswith("higher"):
                lo = last + 1
            elif message["content"].startswith("lower"):
                hi = last - 1
    return f"<guess>{(lo + hi) // 2}</guess>"


async def test_rollouts_and_scores_route_to_each_member(tmp_path: Path) -> None:
    env = mixed.load_environment(num_examples=3, seed=2)
    client = ScriptedClient(_player)
    result = await evaluate_async(
        EvalRequest(env_name="mixed", model="scripted", num_examples=-1, rollouts_per_example=2),
        environment=env,
        client=client,
        options=RunOptions(output_root=tmp_path, registry=False),
    )
    assert result.status == "completed"
    assert result.summary.rollouts == 12
    records = list(iter_records(result.run_dir))
    by_task: dict[str, list[Any]] = {}
    for record in records:
        by_task.setdefault(record.task, []).append(record)
    assert sorted(by_task) == ["arithmetic", "guess_number"]
    for record in by_task["arithmetic"]:
        # arithmetic: one turn, its own rubric and system prompt.
        assert record.turns == 1
        assert set(record.metrics) == {"correct_answer", "format_reward"}
        assert record.reward == pytest.approx(1.2)
        assert "arithmetic problem" in record.prompt[0]["content"]
    for record in by_task["guess_number"]:
        # guess_number: several turns with feedback, its own rubric.
        assert record.metrics["solved"] == 1.0
        assert "efficiency_bonus" in record.metrics and "correct_answer" not in record.metrics
        assert record.stop_reason == "completed"
        feedback = [m["content"] for m in record.completion if m["role"] == "user"]
        assert len(feedback) == record.turns - 1
        assert all(f.startswith(("higher", "lower")) for f in feedback)
        assert "number-guessing game" in record.prompt[0]["content"]
    assert max(r.turns for r in by_task["guess_number"]) > 1
    # Each member's default sampling args reach the client.
    assert all(call["sampling_args"] == {"max_tokens": 256} for call in client.calls)
