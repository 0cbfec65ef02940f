"""Tests of guess_number's game logic with a scripted client (no model, no network)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import guess_number
import pytest

from vfops.clients import ScriptedClient
from vfops.envs import Example, load_environment
from vfops.evaluation import EvalRequest, RunOptions, evaluate_async, iter_records


def _game(secret: int, lo: int = 1, hi: int = 100) -> Example:
    return Example(
        example_id=0,
        prompt=[{"role": "user", "content": f"Guess a number in [{lo}, {hi}]"}],
        answer=str(secret),
        info={"lo": lo, "hi": hi},
    )


def _user_replies(state: dict[str, Any]) -> list[str]:
    return [m["content"] for m in state["completion"] if m["role"] == "user"]


def test_dataset_is_deterministic_per_seed() -> None:
    a = guess_number.load_environment(num_examples=30, seed=7)
    b = guess_number.load_environment(num_examples=30, seed=7)
    c = guess_number.load_environment(num_examples=30, seed=8)
    assert list(a.get_eval_dataset()["answer"]) == list(b.get_eval_dataset()["answer"])
    assert list(a.get_eval_dataset()["answer"]) != list(c.get_eval_dataset()["answer"])
    assert list(a.get_dataset()["answer"])[:30] != list(a.get_eval_dataset()["answer"])
    for example in guess_number.load_environment(num_examples=50, lo=5, hi=9).iter_eval_examples():
        assert 5 <= int(example.answer) <= 9
        assert example.info == {"lo": 5, "hi": 9}
        assert "between 5 and 9" in example.prompt[-1]["content"]


def test_entry_point_and_argument_checks() -> None:
    env = load_environment("guess_number", num_examples=3, max_turns=4)
    assert env.name == "guess_number"
    assert env.max_turns == 4  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="lo must not exceed hi"):
        guess_number.load_environment(lo=10, hi=1)


async def test_feedback_higher_lower_until_solved_stops_early() -> None:
    env = guess_number.load_environment(num_examples=1, max_turns=10)
    client = ScriptedClient(
        [
            "<guess>50</guess>",
            "<think>go down</think><guess>25</guess>",
            "<guess>37</guess>",
            "<guess>31</guess>",
        ]
    )
    state = await env.rollout(client, "m", _game(31))
    assert _user_replies(state) == [
        "lower (9 guesses left)",
        "higher (8 guesses left)",
        "lower (7 guesses left)",
    ]
    assert state["solved"] is True
    assert state["guesses"] == [50, 25, 37, 31]
    assert state["turn"] == 4
    assert state["stop_reason"] == "completed"
    assert state["completion"][-1]["role"] == "assistant"  # no env reply after the win
    assert len(client.calls) == 4
    # The model sees the feedback of the previous guess in its next request.
    assert client.calls[1]["messages"][-1] == {"role": "user", "content": "lower (9 guesses left)"}

    score = await env.rubric.score_rollout(state)
    assert score.metrics["solved"] == 1.0
    assert score.metrics["efficiency_bonus"] == pytest.approx(7 / 10)
    assert score.metrics["format_reward"] == 1.0
    assert score.metrics["num_guesses"] == 4.0
    assert score.metrics["invalid_guesses"] == 0.0
    assert score.reward == pytest.approx(1.0 + 0.5 * 0.7 + 0.1)


async def test_invalid_guesses_get_explanations() -> None:
    env = guess_number.load_environment(num_examples=1, max_turns=10)
    client = ScriptedClient(
        ["I think 40", "<guess>forty</guess>", "<guess>500</guess>", "<guess>40</guess>"]
    )
    state = await env.rollout(client, "m", _game(40))
    replies = _user_replies(state)
    assert replies[0].startswith("invalid guess: no <guess>N</guess> tag")
    assert replies[1].startswith("invalid guess: 'forty' is not an integer")
    assert replies[2].startswith("invalid guess: 500 is outside [1, 100]")
    assert state["solved"] is True
    score = await env.rubric.score_rollout(state)
    assert score.metrics["invalid_guesses"] == 3.0
    assert score.metrics["num_guesses"] == 1.0
    assert score.metrics["format_reward"] == pytest.approx(3 / 4)  # "I think 40" is malformed
    assert score.metrics["efficiency_bonus"] == pytest.approx(7 / 10)


async def test_max_turns_without_solving_scores_zero() -> None:
    env = guess_number.load_environment(num_examples=1, max_turns=3)
    client = ScriptedClient(["<guess>1</guess>"], cycle=True)
    state = await env.rollout(client, "m", _game(77))
    assert state["stop_reason"] == "max_turns"
    assert state["turn"] == 3
    assert state["solved"] is False
    assert _user_replies(state) == ["higher (2 guesses left)", "higher (1 guess left)"]
    score = await env.rubric.score_rollout(state)
    assert score.metrics["solved"] == 0.0
    assert score.metrics["efficiency_bonus"] == 0.0
    assert score.reward == pytest.approx(0.1)


async def test_solved_on_the_last_allowed_turn_counts() -> None:
    env = guess_number.load_environment(num_examples=1, max_turns=2)
    state = await env.rollout(
        ScriptedClient(["<guess>10</guess>", "<guess>11</guess>"]), "m", _game(11)
    )
    assert state["stop_reason"] == "completed"
    score = await env.rubric.score_rollout(state)
    assert score.metrics["solved"] == 1.0
    assert score.metrics["efficiency_bonus"] == pytest.approx(1 / 2)


def _binary_search_player(messages: list[dict[str, Any]], tools: object) -> str:
    """Plays optimally from the feedback in the conversation."""
    lo, hi = 1, 100
    last_guess = None
    for message in messages:
        if message["role"] == "assistant":
            last_guess = int(re.findall(r"\d+", message["content"])[-1])
        elif message["role"] == "user" and last_guess is not None:
            if message["content"].startswith("higher"):
                lo = last_guess + 1
            elif message["content"].startswith("lower"):
                hi = last_guess - 1
    return f"<guess>{(lo + hi) // 2}</guess>"


async def test_eval_with_binary_search_solves_every_game(tmp_path: Path) -> None:
    env = guess_number.load_environment(num_examples=6, max_turns=7)
    result = await evaluate_async(
        EvalRequest(
            env_name="guess_number", model="scripted", num_examples=6, rollouts_per_example=2
        ),
        environment=env,
        client=ScriptedClient(_binary_search_player),
        options=RunOptions(output_root=tmp_path, registry=False),
    )
    assert result.status == "completed"
    assert result.summary.rollouts == 12
    assert result.summary.metrics["solved"].mean == 1.0
    records = list(iter_records(result.run_dir))
    assert len(records) == 12
    assert all(r.stop_reason == "completed" and r.turns <= 7 for r in records)
    assert all(r.reward is not None and r.reward > 1.0 for r in records)
