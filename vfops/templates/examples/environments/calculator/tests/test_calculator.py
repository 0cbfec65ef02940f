"""Tests of calculator's tool, problems and rubric with a scripted client (no network)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import calculator
import orjson
import pytest

from vfops.clients import ScriptedClient
from vfops.envs import Example, load_environment, tool_schema
from vfops.evaluation import EvalRequest, RunOptions, evaluate_async, iter_records

_ids = itertools.count()


def tool_call(expression: Any, name: str = "calculate", raw: str | None = None) -> dict[str, Any]:
    arguments = raw if raw is not None else orjson.dumps({"expression": expression}).decode()
    return {
        "id": f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def calls_message(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": list(calls)}


# --- the tool ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("1 + 2", "3"),
        ("(12 + 3) * 4 - 2 ** 3", "52"),
        ("7 / 2", "3.5"),
        ("6 / 3", "2"),
        ("-3 ** 2", "-9"),
        ("(-3) ** 2", "9"),
        ("--4", "4"),
        ("+5 - -5", "10"),
        ("2 ** -1", "0.5"),
        ("1 / 3", "0.333333333333"),
        ("1.5 * 4", "6"),
        ("  10 - 20  ", "-10"),
        ("2 ** 100", str(2**100)),
    ],
)
def test_calculate_evaluates_arithmetic(expression: str, result: str) -> None:
    assert calculator.calculate(expression) == result


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os')", "function calls are not allowed"),
        ("__import__('os').system('echo hi')", "not allowed"),
        ("(1).__class__", "attribute access is not allowed"),
        ("().__class__.__bases__[0]", "not allowed"),
        ("x + 1", "names are not allowed"),
        ("os", "names are not allowed"),
        ("open('/etc/passwd')", "function calls are not allowed"),
        ("[1, 2]", "List is not allowed"),
        ("'a' * 3", "only numbers are allowed"),
        ("True + 1", "only numbers are allowed"),
        ("1j * 2", "only numbers are allowed"),
        ("7 // 2", "FloorDiv is not allowed"),
        ("7 % 2", "Mod is not allowed"),
        ("~1", "Invert is not allowed"),
        ("1 < 2", "Compare is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("1 +", "invalid syntax"),
        ("import os", "invalid syntax"),
        ("", "expression is empty"),
        ("1 / 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("9 ** 9 ** 9", "exponent"),
        ("10 ** 100 * 10", "too large"),
        ("1e308 * 10", "too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("1" + " + 1" * 300, "longer than"),
    ],
)
def test_calculate_rejects_everything_else(expression: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        calculator.calculate(expression)


def test_tool_schema_comes_from_the_google_docstring() -> None:
    schema = tool_schema(calculator.calculate)["function"]
    assert schema["name"] == "calculate"
    assert schema["description"] == "Evaluate an arithmetic expression and return the result."
    assert schema["parameters"]["required"] == ["expression"]
    prop = schema["parameters"]["properties"]["expression"]
    assert prop["type"] == "string"
    assert prop["description"].startswith("The expression to evaluate")


# --- the problems -----------------------------------------------------------------------
def test_problems_are_deterministic_and_answers_match_their_expressions() -> None:
    a = calculator.load_environment(num_examples=60, seed=5)
    b = calculator.load_environment(num_examples=60, seed=5)
    c = calculator.load_environment(num_examples=60, seed=6)
    rows_a = list(a.iter_eval_examples())
    assert [e.prompt for e in rows_a] == [e.prompt for e in b.iter_eval_examples()]
    assert [e.prompt for e in rows_a] != [e.prompt for e in c.iter_eval_examples()]
    kinds = set()
    for example in rows_a:
        expression = example.info["expression"]
        assert example.answer == calculator.calculate(expression)
        assert float(example.answer) >= 0
        kinds.add(example.info["kind"])
    assert kinds == {p.__name__.lstrip("_") for p in calculator.PROBLEMS}
    assert len(a.get_dataset()) == 1000


def test_entry_point_offers_the_tool() -> None:
    env = load_environment("calculator", num_examples=2)
    assert env.name == "calculator"
    schemas = env.tool_schemas({})  # type: ignore[attr-defined]
    assert [s["function"]["name"] for s in schemas] == ["calculate"]


# --- rollouts and rewards ----------------------------------------------------------------
def _problem(answer: str = "52") -> Example:
    return Example(
        example_id=0,
        prompt=[{"role": "user", "content": "What is (12 + 3) * 4 - 8?"}],
        answer=answer,
        info={"expression": "(12 + 3) * 4 - 8"},
    )


async def test_tool_results_and_errors_go_back_to_the_model() -> None:
    env = calculator.load_environment(num_examples=1)
    client = ScriptedClient(
        [
            calls_message(
                tool_call("__import__('os').system('rm -rf /')"),
                tool_call("(12 + 3) * 4"),
            ),
            calls_message(tool_call("60 - 8"), tool_call(None, name="sqrt", raw='{"x": 4}')),
            calls_message(tool_call(None, raw="not json")),
            "<answer>52</answer>",
        ]
    )
    state = await env.rollout(client, "m", _problem())
    tool_messages = [m for m in state["completion"] if m["role"] == "tool"]
    contents = [m["content"] for m in tool_messages]
    assert contents[0].startswith("Error: ValueError: function calls are not allowed")
    assert contents[1] == "60"
    assert contents[2] == "52"
    assert contents[3].startswith("Error: LookupError: unknown tool 'sqrt'")
    assert contents[4].startswith("Error: ValueError: tool arguments are not valid JSON")
    # Each tool message answers its call, and the model saw them before answering.
    call_ids = [c["id"] for m in state["completion"] for c in m.get("tool_calls") or []]
    assert [m["tool_call_id"] for m in tool_messages] == call_ids
    assert client.calls[1]["messages"][-1]["content"] == "60"
    assert client.calls[0]["tools"][0]["function"]["name"] == "calculate"
    assert state["tool_stats"]["calls"] == 5
    assert state["tool_stats"]["errors"] == 3
    assert state["stop_reason"] == "completed"

    score = (await env.rubric_for("default").score_group([state]))[0]
    assert score.metrics["correct_answer"] == 1.0
    assert score.metrics["used_calculator"] == 1.0
    assert score.metrics["total_tool_calls"] == 5.0
    assert score.metrics["tool_errors"] == 3.0
    assert score.metrics["tool_calls/calculate"] == 4.0  # the bad-JSON call included
    assert score.reward == pytest.approx(1.1)


@pytest.mark.parametrize(
    ("final", "answer", "correct"),
    [
        ("<answer>52</answer>", "52", 1.0),
        ("<answer>52.00001</answer>", "52", 1.0),  # within the relative tolerance
        ("<answer>It is 52 cents</answer>", "52", 1.0),
        ("<answer>1,250.5</answer>", "1250.5", 1.0),
        ("<answer>-3</answer>", "-3", 1.0),
        ("<answer>53</answer>", "52", 0.0),
        ("<answer>fifty-two</answer>", "52", 0.0),
        ("52", "52", 0.0),  # no answer tag
        ("<answer>52", "52", 0.0),  # unclosed
    ],
)
async def test_numeric_match_with_tolerance(final: str, answer: str, correct: float) -> None:
    env = calculator.load_environment(num_examples=1)
    state = await env.rollout(ScriptedClient([final]), "m", _problem(answer))
    score = (await env.rubric_for("default").score_group([state]))[0]
    assert score.metrics["correct_answer"] == correct
    assert score.metrics["used_calculator"] == 0.0  # answered without the tool
    assert score.reward == pytest.approx(correct)


async def test_only_failed_tool_calls_earn_no_tool_bonus() -> None:
    env = calculator.load_environment(num_examples=1, tool_use_weight=0.5)
    client = ScriptedClient([calls_message(tool_call("x * 2")), "<answer>52</answer>"])
    state = await env.rollout(client, "m", _problem())
    score = (await env.rubric_for("default").score_group([state]))[0]
    assert score.metrics["used_calculator"] == 0.0
    assert score.reward == pytest.approx(1.0)


def _tool_using_solver(messages: list[dict[str, Any]], tools: object) -> dict[str, Any] | str:
    """Calls the tool with the hidden expression, then answers with its result."""
    if messages[-1]["role"] == "tool":
        return f"<think>the tool says so</think><answer>{messages[-1]['content']}</answer>"
    question = messages[-1]["content"]
    expression = _EXPRESSIONS[question]
    return calls_message(tool_call(expression))


_EXPRESSIONS: dict[str, str] = {}


async def test_eval_end_to_end_with_tool_calls(tmp_path: Path) -> None:
    env = calculator.load_environment(num_examples=8, seed=2)
    for example in env.iter_eval_examples():
        _EXPRESSIONS[example.prompt[-1]["content"]] = example.info["expression"]
    result = await evaluate_async(
        EvalRequest(
            env_name="calculator", model="scripted", num_examples=8, rollouts_per_example=2
        ),
        environment=env,
        client=ScriptedClient(_tool_using_solver),
        options=RunOptions(output_root=tmp_path, registry=False),
    )
    assert result.status == "completed"
    assert result.summary.rollouts == 16
    assert result.summary.metrics["correct_answer"].mean == 1.0
    assert result.summary.metrics["used_calculator"].mean == 1.0
    assert result.summary.metrics["total_tool_calls"].mean == 1.0
    assert result.summary.reward.mean == pytest.approx(1.1)
    records = list(iter_records(result.run_dir))
    assert all(r.turns == 2 and r.stop_reason == "completed" for r in records)
