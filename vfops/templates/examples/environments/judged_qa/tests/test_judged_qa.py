"""Tests of judged_qa with scripted model and judge clients (no network)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import judged_qa
import pytest

from vfops.clients import OpenAIClient, ScriptedClient
from vfops.envs import Example, load_environment
from vfops.evaluation import EvalRequest, RunOptions, evaluate_async, iter_records


def _judge_from_prompt(messages: list[dict[str, Any]], tools: object) -> str:
    """A judge that says yes when the response's text equals the reference answer."""
    text = messages[-1]["content"]
    answer = text.split("Ground truth answer:\n```\n", 1)[1].split("\n```", 1)[0]
    response = text.split("Response:\n```\n", 1)[1].split("\n```", 1)[0]
    return "yes" if response.strip().lower() == answer.strip().lower() else "no"


def test_dataset_ships_inline() -> None:
    env = judged_qa.load_environment(judge_client=ScriptedClient(["yes"]))
    rows = list(env.iter_eval_examples())
    assert 25 <= len(rows) <= 40
    assert len({e.prompt[-1]["content"] for e in rows}) == len(rows)
    assert all(e.answer for e in rows)
    assert rows[0].prompt[-1]["content"] == "What is the capital of France?"
    assert rows[0].answer == "Paris"
    assert "<answer>" in rows[0].prompt[0]["content"]
    small = judged_qa.load_environment(num_examples=5, judge_client=ScriptedClient(["yes"]))
    assert len(small.get_eval_dataset()) == 5
    with pytest.raises(ValueError, match="num_examples"):
        judged_qa.load_environment(num_examples=0, judge_client=ScriptedClient(["yes"]))


async def test_judge_gets_question_answer_and_parsed_response() -> None:
    judge = ScriptedClient(["Yes, the response is correct."])
    env = judged_qa.load_environment(judge_client=judge, judge_model="judge-x")
    example = next(iter(env.iter_eval_examples()))
    state = await env.rollout(
        ScriptedClient(["<think>France...</think><answer>Paris</answer>"]), "m", example
    )
    score = await env.rubric.score_rollout(state)
    assert score.metrics == {"judge_reward": 1.0, "format_reward": 1.0}
    assert score.reward == pytest.approx(1.1)
    assert len(judge.calls) == 1
    call = judge.calls[0]
    assert call["model"] == "judge-x"
    assert call["sampling_args"] == {"temperature": 0.0}
    prompt = call["messages"][-1]["content"]
    assert "What is the capital of France?" in prompt
    assert "Ground truth answer:\n```\nParis\n```" in prompt
    assert "Response:\n```\nParis\n```" in prompt
    assert "France..." not in prompt  # only the parsed answer is judged
    assert state["judge_response"] == "Yes, the response is correct."


@pytest.mark.parametrize(
    ("reply", "judge_reply", "judged", "formatted"),
    [
        ("<answer>Lyon</answer>", "no", 0.0, 1.0),
        ("Paris", "no", 0.0, 0.0),  # no answer tag: the judge sees an empty response
        ("<answer>Paris</answer>", "NO. It is not.", 0.0, 1.0),
        ("<answer>Paris</answer>", "I cannot tell", 0.0, 1.0),
    ],
)
async def test_wrong_and_malformed_answers(
    reply: str, judge_reply: str, judged: float, formatted: float
) -> None:
    judge = ScriptedClient([judge_reply])
    env = judged_qa.load_environment(judge_client=judge)
    example = next(iter(env.iter_eval_examples()))
    state = await env.rollout(ScriptedClient([reply]), "m", example)
    score = await env.rubric.score_rollout(state)
    assert score.metrics == {"judge_reward": judged, "format_reward": formatted}
    if reply == "Paris":
        assert "Response:\n```\n\n```" in judge.calls[0]["messages"][-1]["content"]


async def test_judge_failure_is_a_scoring_error_not_a_crash() -> None:
    env = judged_qa.load_environment(judge_client=ScriptedClient([ValueError("judge broke")]))
    example = Example(example_id=0, prompt=[{"role": "user", "content": "Q?"}], answer="A")
    state = await env.rollout(ScriptedClient(["<answer>A</answer>"]), "m", example)
    score = await env.rubric.score_rollout(state)
    assert score.reward is None
    assert score.error is not None and "judge broke" in score.error.message


def test_default_judge_endpoint_from_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFOPS_JUDGE_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-secret-123")
    env = load_environment("judged_qa", judge_api_key_var="MY_JUDGE_KEY", judge_model="j")
    client = env.rubric.judge_client  # type: ignore[attr-defined]
    assert isinstance(client, OpenAIClient)
    assert client.base_url == "http://127.0.0.1:9/v1"
    assert "sk-secret-123" not in repr(client)
    assert "sk-secret-123" not in repr(vars(env))
    assert "sk-secret-123" not in repr(vars(env.rubric))
    explicit = judged_qa.load_environment(judge_base_url="http://localhost:8001/v1")
    assert explicit.rubric.judge_client.base_url == "http://localhost:8001/v1"  # type: ignore[attr-defined]


def test_missing_openai_key_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VFOPS_JUDGE_BASE_URL", raising=False)
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(ValueError, match="set the environment variable NO_SUCH_KEY_VAR"):
        judged_qa.load_environment(judge_api_key_var="NO_SUCH_KEY_VAR")


async def test_eval_end_to_end_with_a_scripted_judge(tmp_path: Path) -> None:
    judge = ScriptedClient(_judge_from_prompt)
    env = judged_qa.load_environment(num_examples=6, judge_client=judge)
    answers = {e.prompt[-1]["content"]: e.answer for e in env.iter_eval_examples()}
    questions = list(answers)

    def model(messages: list[dict[str, Any]], tools: object) -> str:
        question = messages[-1]["content"]
        right = questions.index(question) < 3
        return f"<answer>{answers[question] if right else 'I do not know'}</answer>"

    result = await evaluate_async(
        EvalRequest(env_name="judged_qa", model="scripted", num_examples=6, rollouts_per_example=2),
        environment=env,
        client=ScriptedClient(model),
        options=RunOptions(output_root=tmp_path, registry=False),
    )
    assert result.status == "completed"
    assert result.summary.rollouts == 12
    assert result.summary.metrics["judge_reward"].mean == pytest.approx(0.5)
    assert result.summary.metrics["format_reward"].mean == 1.0
    records = list(iter_records(result.run_dir))
    assert all(r.error is None for r in records)
    assert len(judge.calls) >= 6  # identical responses of one example may share a call
