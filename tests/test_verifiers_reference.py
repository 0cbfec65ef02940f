"""verifiers' own evaluation of the test environments, against the deterministic stub.

Each package under ``tests/verifiers_envs`` (installed into the venv, non-editable)
is run by ``tests.verifiers_reference`` (``vf.load_environment`` +
``Environment.evaluate``, verifiers 0.3.1) against vfops' in-process stub server
answering with ``tests.verifiers_stub.reply``. The tests pin what verifiers
itself scores, per example, so that vfops' adapter can be held to the same
numbers, and check that the stub's deliberate mistakes, the multi-turn and tool
paths and EnvGroup's routing really happen.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
import verifiers as vf
import vf_group
import vf_guess
import vf_tools
import vf_xml_math

from tests.verifiers_reference import (
    Output,
    metrics_by_example,
    rewards_by_example,
    verifiers_metrics,
    verifiers_outputs,
    verifiers_rewards,
)
from tests.verifiers_stub import mode_for, reply, task_of
from vfops.testing._stub_server import StubConfig, StubServer

R = 2  # rollouts per example
N = 8  # examples (vf-group: 10, five per sub-environment)

# What verifiers scores for each example, given the stub's choice for that row.
XML_MATH_REWARDS = {0: 1.2, 1: 0.0, 2: 0.04, 3: 0.0, 4: 0.04, 5: 0.2, 6: 0.2, 7: 1.12}
GUESS_REWARDS = {0: 1.0, 1: 1.16, 2: 1.08, 3: 1.16, 4: 0.0, 5: 0.0, 6: 1.16, 7: 0.0}
GUESS_TURNS = {0: 6, 1: 2, 2: 4, 3: 2, 4: 6, 5: 6, 6: 2, 7: 6}
TOOLS_REWARDS = {0: 0.2, 1: 0.2, 2: 0.2, 3: 1.0, 4: 1.2, 5: 0.2, 6: 1.0, 7: 0.2}
TOOLS_CALLS = {0: 2, 1: 2, 2: 4, 3: 0, 4: 2, 5: 2, 6: 0, 7: 2}
GROUP_REWARDS = {
    0: 0.04, 1: 0.2, 2: 0.0, 3: 1.2, 4: 0.04,  # math
    5: 1.5, 6: 0.5, 7: 0.0, 8: 0.5, 9: 0.5,  # upper
}  # fmt: skip


@dataclass
class Run:
    outputs: list[Output]
    requests: list[dict[str, Any]]

    @property
    def rewards(self) -> dict[int, list[float]]:
        return rewards_by_example(self.outputs)

    @property
    def metrics(self) -> dict[int, list[dict[str, float]]]:
        return metrics_by_example(self.outputs)

    def by_example(self, example_id: int) -> list[Output]:
        return [o for o in self.outputs if o["example_id"] == example_id]


def run_env(env_id: str, num_examples: int, env_args: dict[str, Any] | None = None) -> Run:
    with StubServer(StubConfig(reply_mode=reply, record_requests=True)) as server:
        outputs = verifiers_outputs(
            env_id,
            server.base_url,
            num_examples=num_examples,
            rollouts_per_example=R,
            env_args=env_args,
        )
        return Run(outputs, list(server.requests))


def field(message: Any, name: str) -> Any:
    """A message field: verifiers' outputs mix pydantic messages and plain dicts."""
    if isinstance(message, dict):
        return message.get(name)
    return getattr(message, name, None)


def roles(completion: list[Any]) -> list[str]:
    return [field(m, "role") for m in completion]


def tool_calls(message: Any) -> list[dict[str, Any]]:
    """A message's tool calls as dicts ({"id", "name", "arguments"}); outputs hold
    them as JSON strings."""
    calls = field(message, "tool_calls") or []
    return [json.loads(c) if isinstance(c, str) else dict(c) for c in calls]


def assert_rewards(rewards: dict[int, list[float]], expected: dict[int, float]) -> None:
    assert set(rewards) == set(expected)
    for example_id, value in expected.items():
        assert rewards[example_id] == pytest.approx([value] * R), example_id


@pytest.fixture(scope="module")
def xml_math() -> Run:
    return run_env("vf-xml-math", N)


@pytest.fixture(scope="module")
def guess() -> Run:
    return run_env("vf-guess", N)


@pytest.fixture(scope="module")
def tools() -> Run:
    return run_env("vf-tools", N)


@pytest.fixture(scope="module")
def group() -> Run:
    return run_env("vf-group", 10)


@pytest.mark.parametrize("name", ["xml_math", "guess", "tools", "group"])
def test_every_example_gets_r_rewards_and_they_differ(
    name: str, request: pytest.FixtureRequest
) -> None:
    run: Run = request.getfixturevalue(name)
    rewards = run.rewards
    num_examples = 10 if name == "group" else N
    assert sorted(rewards) == list(range(num_examples))
    assert all(len(values) == R for values in rewards.values())
    # the stub is deterministic: every rollout of an example scores the same ...
    assert all(len(set(values)) == 1 for values in rewards.values())
    # ... but its deliberate mistakes make examples score differently
    assert len({values[0] for values in rewards.values()}) >= 3
    assert all(o["is_completed"] for o in run.outputs)


# --- the stub ------------------------------------------------------------------------


def test_stub_choices_for_the_pinned_rows() -> None:
    """The per-example values below follow from these choices (a stable hash)."""
    questions = [r["question"] for r in vf_xml_math.build_rows(N)]
    assert [mode_for("math", q) for q in questions] == [
        "correct", "empty", "plain", "empty", "plain", "wrong", "wrong", "answer_only",
    ]  # fmt: skip
    rows = vf_guess.build_rows(N)
    assert [(mode_for("guess", r["question"]), int(r["answer"])) for r in rows] == [
        ("linear", 6), ("binary", 12), ("linear", 4), ("binary", 4),
        ("linear", 7), ("never", 11), ("binary", 12), ("linear", 14),
    ]  # fmt: skip
    questions = [r["question"] for r in vf_tools.build_rows(N)]
    assert [mode_for("tools", q) for q in questions] == [
        "wrong_final", "wrong_final", "loop", "no_tools",
        "correct", "wrong_final", "no_tools", "wrong_final",
    ]  # fmt: skip
    questions = [r["question"] for r in vf_group.math_rows(5)]
    assert [mode_for("math", q) for q in questions] == [
        "plain", "wrong", "empty", "correct", "plain",
    ]  # fmt: skip
    questions = [r["question"] for r in vf_group.upper_rows(5)]
    assert [mode_for("upper", q) for q in questions] == [
        "exact", "lower", "wrong", "lower", "lower",
    ]  # fmt: skip


def test_stub_is_a_function_of_the_request() -> None:
    system = {"role": "system", "content": vf_guess.SYSTEM_PROMPT}
    user = {"role": "user", "content": "Game 2: guess my secret integer from 1 to 16."}
    first = {"messages": [system, user]}
    assert task_of(first) == "guess"
    assert reply(first) == reply(first) == {"role": "assistant", "content": "<guess>8</guess>"}
    later = {
        "messages": [system, user, reply(first), {"role": "user", "content": "higher"}],
    }
    assert reply(later)["content"] == "<guess>12</guess>"  # binary search: 9..16
    tools_request = {
        "messages": [
            {"role": "system", "content": vf_tools.SYSTEM_PROMPT},
            {"role": "user", "content": "What is (4 + 14) * 6?"},
        ],
        "tools": [{"type": "function", "function": {"name": "add"}}],
    }
    assert task_of(tools_request) == "tools"
    call = reply(tools_request)["tool_calls"][0]
    assert call["function"] == {"name": "add", "arguments": json.dumps({"a": 4, "b": 14})}


# --- vf-xml-math ---------------------------------------------------------------------


def test_xml_math_rewards(xml_math: Run) -> None:
    assert_rewards(xml_math.rewards, XML_MATH_REWARDS)
    for output in xml_math.outputs:  # reward = 1.0 * correct_answer + 0.2 * format
        metrics = output["metrics"]
        assert set(metrics) == {"correct_answer", "format_reward_func", "num_turns"}
        assert output["reward"] == pytest.approx(
            metrics["correct_answer"] + 0.2 * metrics["format_reward_func"]
        )
    metrics = xml_math.metrics
    assert metrics[0][0] == {"correct_answer": 1.0, "format_reward_func": 1.0, "num_turns": 1.0}
    assert metrics[5][0] == {"correct_answer": 0.0, "format_reward_func": 1.0, "num_turns": 1.0}
    assert metrics[7][0] == pytest.approx(
        {"correct_answer": 1.0, "format_reward_func": 0.6, "num_turns": 1.0}
    )
    assert metrics[2][0] == pytest.approx(
        {"correct_answer": 0.0, "format_reward_func": 0.2, "num_turns": 1.0}
    )


def test_xml_math_empty_reply_is_a_scored_error(xml_math: Run) -> None:
    """verifiers records the empty reply as an error, stops, and still scores it (0.0)."""
    for output in xml_math.by_example(1) + xml_math.by_example(3):
        assert output["stop_condition"] == "has_error"
        assert output["completion"] == []
        assert output["error"]["error"] == "EmptyModelResponseError"
        assert output["metrics"] == {
            "correct_answer": 0.0,
            "format_reward_func": 0.0,
            "num_turns": 0.0,
        }
    for output in xml_math.by_example(0):
        assert output["error"] is None
        assert output["stop_condition"] == "max_turns_reached"  # SingleTurnEnv: max_turns=1
        assert roles(output["completion"]) == ["assistant"]


def test_verifiers_rewards_and_metrics_entry_points() -> None:
    with StubServer(StubConfig(reply_mode=reply, record_requests=True)) as server:
        rewards = verifiers_rewards(
            "vf-xml-math",
            server.base_url,
            num_examples=4,
            rollouts_per_example=3,
            env_args={"num_examples": 6},
            sampling_args={"temperature": 0.0, "max_tokens": 64},
        )
        metrics = verifiers_metrics(
            "vf-xml-math", server.base_url, num_examples=2, rollouts_per_example=1
        )
        requests = list(server.requests)
    assert rewards == {k: pytest.approx([XML_MATH_REWARDS[k]] * 3) for k in range(4)}
    assert metrics == {
        0: [{"correct_answer": 1.0, "format_reward_func": 1.0, "num_turns": 1.0}],
        1: [{"correct_answer": 0.0, "format_reward_func": 0.0, "num_turns": 0.0}],
    }
    assert len(requests) == 4 * 3 + 2
    # sampling_args reach the endpoint (0.3.1 renames max_tokens to max_completion_tokens)
    sampled = requests[: 4 * 3]
    assert all(r["temperature"] == 0.0 and r["max_completion_tokens"] == 64 for r in sampled)
    assert all("temperature" not in r for r in requests[4 * 3 :])


# --- vf-guess ------------------------------------------------------------------------


def test_guess_rewards_and_turns(guess: Run) -> None:
    assert_rewards(guess.rewards, GUESS_REWARDS)
    for example_id, turns in GUESS_TURNS.items():
        for output in guess.by_example(example_id):
            completion = output["completion"]
            assert output["metrics"]["num_turns"] == turns
            # one model turn per guess, with higher/lower in between
            assert roles(completion) == ["assistant", "user"] * (turns - 1) + ["assistant"]
            feedback = {field(m, "content") for m in completion if field(m, "role") == "user"}
            assert feedback <= {"higher", "lower"}
            solved = GUESS_REWARDS[example_id] > 0
            assert output["metrics"]["solved"] == (1.0 if solved else 0.0)
            assert output["stop_condition"] == (
                "guessed_correctly" if solved else "max_turns_reached"
            )
    assert any(turns > 1 for turns in GUESS_TURNS.values())
    # the model side really saw the conversation grow: 2 + 2 * (turns - 1) messages
    lengths = {len(r["messages"]) for r in guess.requests}
    assert lengths == {2, 4, 6, 8, 10, 12}
    assert len(guess.requests) == R * sum(GUESS_TURNS.values())


def test_guess_binary_search_path(guess: Run) -> None:
    (output, _) = guess.by_example(3)  # secret 4: 8 -> lower -> 4
    contents = [field(m, "content") for m in output["completion"]]
    assert contents == ["<guess>8</guess>", "lower", "<guess>4</guess>"]
    assert output["metrics"] == pytest.approx({"solved": 1.0, "speed_bonus": 0.8, "num_turns": 2.0})


def test_guess_final_env_response_mode() -> None:
    """Same rewards; a solved game ends on the env's "correct" instead of on the guess."""
    run = run_env("vf-guess", N, env_args={"stop_mode": "final_env_response"})
    assert_rewards(run.rewards, GUESS_REWARDS)
    (output, _) = run.by_example(1)  # secret 12: 8 -> higher -> 12 -> correct
    assert [field(m, "content") for m in output["completion"]] == [
        "<guess>8</guess>",
        "higher",
        "<guess>12</guess>",
        "correct",
    ]
    assert output["stop_condition"] == "has_final_env_response"
    assert output["metrics"]["num_turns"] == 2
    # solved on the last allowed turn: max_turns_reached fires before env_response
    (output, _) = run.by_example(0)
    assert output["stop_condition"] == "max_turns_reached"
    assert field(output["completion"][-1], "content") == "<guess>6</guess>"


# --- vf-tools ------------------------------------------------------------------------


def test_tools_rewards_and_tool_metrics(tools: Run) -> None:
    assert_rewards(tools.rewards, TOOLS_REWARDS)
    for example_id, calls in TOOLS_CALLS.items():
        for output in tools.by_example(example_id):
            metrics = output["metrics"]
            assert metrics["total_tool_calls"] == calls
            assert metrics["used_tools"] == (1.0 if calls else 0.0)
            assert metrics["add_calls"] + metrics["multiply_calls"] == calls
    every_request_had_tools = all(
        sorted(t["function"]["name"] for t in r["tools"]) == ["add", "multiply"]
        for r in tools.requests
    )
    assert every_request_had_tools


def test_tools_results_appear_in_the_completion(tools: Run) -> None:
    (output, _) = tools.by_example(4)  # (4 + 14) * 6, all correct
    completion = output["completion"]
    assert roles(completion) == ["assistant", "tool", "assistant", "tool", "assistant"]
    first, second = tool_calls(completion[0]), tool_calls(completion[2])
    assert [c["name"] for c in first + second] == ["add", "multiply"]
    assert json.loads(first[0]["arguments"]) == {"a": 4, "b": 14}
    assert json.loads(second[0]["arguments"]) == {"a": 18, "b": 6}  # add's result fed on
    assert field(completion[1], "content") == "18"
    assert field(completion[1], "tool_call_id") == first[0]["id"]
    assert field(completion[3], "content") == "108"
    assert field(completion[4], "content") == "<answer>108</answer>"
    assert output["stop_condition"] == "no_tools_called"
    assert output["metrics"] == {
        "correct_answer": 1.0,
        "used_tools": 1.0,
        "num_turns": 3.0,
        "total_tool_calls": 2.0,
        "add_calls": 1.0,
        "multiply_calls": 1.0,
    }
    (output, _) = tools.by_example(0)  # (18 + 23) * 9 = 369; answers 370
    assert field(output["completion"][3], "content") == "369"
    assert field(output["completion"][-1], "content") == "<answer>370</answer>"


def test_tools_loop_hits_max_turns(tools: Run) -> None:
    (output, _) = tools.by_example(2)
    completion = output["completion"]
    assert output["stop_condition"] == "max_turns_reached"
    assert output["metrics"]["num_turns"] == 4
    # the last call is never answered: the rollout stops before env_response
    assert roles(completion) == ["assistant", "tool"] * 3 + ["assistant"]
    assert [c["name"] for m in completion for c in tool_calls(m)] == ["add"] * 4


# --- vf-group ------------------------------------------------------------------------


def test_group_routes_rows_to_their_own_rubric(group: Run) -> None:
    assert_rewards(group.rewards, GROUP_REWARDS)
    math_metrics = {"math_correct", "format_reward_func", "num_turns"}
    upper_metrics = {"upper_exact", "upper_ignoring_case", "num_turns"}
    for output in group.outputs:
        is_math = output["example_id"] < 5
        assert output["info"] == {"env_id": "math" if is_math else "upper"}
        assert set(output["metrics"]) == (math_metrics if is_math else upper_metrics)
    # an upper row scored by the math rubric would get 0.04 ("WINDOW" has no tags)
    (output, _) = group.by_example(5)
    assert field(output["completion"][0], "content") == "WINDOW"
    assert output["metrics"] == {"upper_exact": 1.0, "upper_ignoring_case": 1.0, "num_turns": 1.0}
    (output, _) = group.by_example(6)
    assert field(output["completion"][0], "content") == "tiger"
    assert output["reward"] == pytest.approx(0.5)
    (output, _) = group.by_example(3)
    assert output["metrics"] == {"math_correct": 1.0, "format_reward_func": 1.0, "num_turns": 1.0}
    # each sub-environment's rows went out with its own system prompt
    systems = [r["messages"][0]["content"] for r in group.requests]
    assert systems.count(vf_group.MATH_SYSTEM_PROMPT) == 5 * R
    assert systems.count(vf_group.UPPER_SYSTEM_PROMPT) == 5 * R


def test_group_is_an_env_group() -> None:
    env = vf.load_environment("vf-group")
    assert isinstance(env, vf.EnvGroup)
    assert env.env_names == ["math", "upper"]
    assert all(isinstance(e, vf.SingleTurnEnv) for e in env.envs)
