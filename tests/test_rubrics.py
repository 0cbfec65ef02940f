"""Rubrics: argument injection, weights, errors, groups, math and judge scoring."""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
from typing import Any

import pytest

from vfops._errors import VfopsError
from vfops._types import Messages, State
from vfops.clients._scripted import ScriptedClient
from vfops.parsers import Parser, XMLParser
from vfops.rubrics import (
    InMemoryJudgeCache,
    JudgeRubric,
    MathRubric,
    Rubric,
    RubricGroup,
    ToolMetricsRubric,
)

ALL_ARGS = {
    "prompt",
    "completion",
    "answer",
    "state",
    "info",
    "task",
    "parser",
    "example_id",
    "rollout_index",
}


def make_state(text: str = "4", answer: str = "4", index: int = 0, **extra: Any) -> State:
    state: State = {
        "prompt": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "What is 2+2?"},
        ],
        "completion": [{"role": "assistant", "content": text}],
        "answer": answer,
        "info": {"level": 1},
        "task": "arith",
        "example_id": 3,
        "rollout_index": index,
    }
    state.update(extra)
    return state


def group(*texts: str, answer: str = "4") -> list[State]:
    return [make_state(t, answer, i) for i, t in enumerate(texts)]


# --- Rubric: injection, weights, sync/async -------------------------------------------


async def test_function_receives_only_the_arguments_it_names() -> None:
    seen: list[tuple[str, ...]] = []

    def only_answer(answer: str) -> float:
        seen.append((answer,))
        return 1.0

    received: list[dict[str, Any]] = []

    def everything(**kwargs: Any) -> float:
        received.append(kwargs)
        return 0.0

    rubric = Rubric([only_answer, everything])
    [score] = await rubric.score_group([make_state(answer="42")])
    assert score.error is None
    assert seen == [("42",)]
    assert set(received[0]) == ALL_ARGS
    assert received[0]["task"] == "arith"
    assert received[0]["info"] == {"level": 1}
    assert received[0]["parser"] is rubric.parser
    assert score.metrics == {"only_answer": 1.0, "everything": 0.0}


async def test_weighted_sum_of_sync_and_async_functions_and_metrics() -> None:
    def exact(completion: Messages, answer: str) -> float:
        return 1.0 if completion[-1]["content"] == answer else 0.0

    async def length_bonus(completion: Messages) -> float:
        await asyncio.sleep(0)
        return len(completion[-1]["content"]) / 10

    def always_seven() -> int:
        return 7

    rubric = Rubric([exact, length_bonus], weights=[2.0, 0.5])
    rubric.add_metric(always_seven)
    scores = await rubric.score_group(group("4", "wrong"))
    assert [s.reward for s in scores] == pytest.approx([2.0 + 0.05, 0.0 + 0.25])
    assert scores[1].metrics == pytest.approx(
        {"exact": 0.0, "length_bonus": 0.5, "always_seven": 7.0}
    )
    assert rubric.reward_func_names == ["exact", "length_bonus", "always_seven"]
    assert rubric.reward_weights == [2.0, 0.5, 0.0]
    assert all(s.scoring_ms > 0 for s in scores)
    assert all(s.error is None for s in scores)


class InFlight:
    """Counts how many awaited calls overlap (concurrency observed, not timed)."""

    def __init__(self) -> None:
        self.now = self.most = 0

    async def hold(self, seconds: float = 0.05) -> None:
        self.now += 1
        self.most = max(self.most, self.now)
        await asyncio.sleep(seconds)
        self.now -= 1


async def test_async_functions_run_concurrently() -> None:
    in_flight = InFlight()

    async def slow(state: State) -> float:
        await in_flight.hold()
        return 1.0

    async def also_slow(state: State) -> float:
        await in_flight.hold()
        return 1.0

    scores = await Rubric([slow, also_slow]).score_group(group("a", "b", "c"))
    assert in_flight.most == 6  # two functions x three rollouts, all at once
    assert [s.reward for s in scores] == [2.0, 2.0, 2.0]


async def test_group_function_gets_lists_and_returns_one_score_per_rollout() -> None:
    calls: list[int] = []

    def rank(
        completions: list[Messages], answers: list[str], example_ids: list[int]
    ) -> list[float]:
        calls.append(len(completions))
        assert example_ids == [3, 3, 3]
        lengths = [len(c[-1]["content"]) for c in completions]
        return [1.0 if n == min(lengths) else 0.0 for n in lengths]

    scores = await Rubric([rank]).score_group(group("aaa", "a", "aa"))
    assert calls == [3]  # called once for the whole group
    assert [s.reward for s in scores] == [0.0, 1.0, 0.0]


async def test_score_rollout_scores_a_group_of_one() -> None:
    score = await Rubric([lambda answer: float(answer)]).score_rollout(make_state(answer="2.5"))
    assert score.reward == 2.5
    assert score.metrics == {"<lambda>": 2.5}


async def test_signatures_are_inspected_once_not_per_rollout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def exact(completion: Messages, answer: str) -> float:
        return 1.0

    rubric = Rubric([exact])
    counted: list[object] = []
    real_signature = inspect.signature

    def counting_signature(obj: Any, *args: Any, **kwargs: Any) -> inspect.Signature:
        counted.append(obj)
        return real_signature(obj, *args, **kwargs)

    monkeypatch.setattr(inspect, "signature", counting_signature)
    await rubric.score_group(group(*["4"] * 50))
    assert counted == []


# --- Rubric: configuration errors -----------------------------------------------------


def test_unknown_required_argument_is_rejected_when_added() -> None:
    def needs_magic(magic: int) -> float:
        return 0.0

    with pytest.raises(VfopsError, match="'magic'"):
        Rubric([needs_magic])


def test_mixing_group_and_rollout_arguments_is_rejected() -> None:
    def mixed(completions: list[Messages], answer: str) -> list[float]:
        return []

    with pytest.raises(VfopsError, match="mixes"):
        Rubric([mixed])


def test_duplicate_names_and_weight_count_are_rejected() -> None:
    def f() -> float:
        return 0.0

    with pytest.raises(VfopsError, match="already has"):
        Rubric([f, f])
    with pytest.raises(VfopsError, match="weights"):
        Rubric([f], weights=[1.0, 2.0])


# --- Rubric: errors are recorded, never scored 0 --------------------------------------


async def test_raising_function_gives_reward_none_and_others_still_run() -> None:
    def fine(answer: str) -> float:
        return 1.0

    def fragile(completion: Messages) -> float:
        if completion[-1]["content"] == "boom":
            raise KeyError("missing field")
        return 0.5

    async def later(answer: str) -> float:
        return 0.25

    scores = await Rubric([fine, fragile, later]).score_group(group("ok", "boom"))
    ok, bad = scores
    assert ok.reward == pytest.approx(1.75)
    assert ok.error is None
    assert bad.reward is None
    assert bad.error is not None
    assert bad.error.stage == "scoring"
    assert bad.error.type == "KeyError"
    assert "fragile" in bad.error.message
    assert bad.metrics == {"fine": 1.0, "later": 0.25}


async def test_raising_async_function_is_recorded() -> None:
    async def judge_like(answer: str) -> float:
        raise TimeoutError("judge timed out")

    [score] = await Rubric([judge_like]).score_group([make_state()])
    assert score.reward is None
    assert score.error is not None
    assert score.error.type == "TimeoutError"
    assert "judge_like" in score.error.message


async def test_raising_group_function_marks_every_rollout() -> None:
    def per_rollout(answer: str) -> float:
        return 1.0

    def broken_group(completions: list[Messages]) -> list[float]:
        raise RuntimeError("group failed")

    scores = await Rubric([per_rollout, broken_group]).score_group(group("a", "b"))
    for score in scores:
        assert score.reward is None
        assert score.error is not None
        assert "broken_group" in score.error.message
        assert score.metrics == {"per_rollout": 1.0}


@pytest.mark.parametrize(
    "value",
    ["1.0", None, [1.0], float("nan"), float("inf"), float("-inf")],
)
async def test_non_numeric_return_is_an_error(value: Any) -> None:
    def odd() -> Any:
        return value

    [score] = await Rubric([odd]).score_group([make_state()])
    assert score.reward is None
    assert score.error is not None
    assert "odd" in score.error.message


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
async def test_non_finite_reward_is_an_invalid_reward_naming_function_and_value(
    value: float,
) -> None:
    def blows_up() -> float:
        return value

    async def blows_up_async() -> float:
        return value

    def blows_up_group(completions: list[Messages]) -> list[float]:
        return [value for _ in completions]

    for func in (blows_up, blows_up_async, blows_up_group):
        [score] = await Rubric([func]).score_group([make_state()])
        assert score.reward is None
        assert score.error is not None
        assert score.error.type == "InvalidReward"
        assert func.__name__ in score.error.message
        assert str(value) in score.error.message


async def test_weighted_sum_that_overflows_is_an_invalid_reward() -> None:
    def huge() -> float:
        return 1e308

    [score] = await Rubric([huge], weights=[10.0]).score_group([make_state()])
    assert score.reward is None
    assert score.error is not None and score.error.type == "InvalidReward"


async def test_bool_and_int_returns_are_numbers() -> None:
    [score] = await Rubric([lambda: True]).score_group([make_state()])
    assert score.reward == 1.0


async def test_group_function_with_wrong_length_is_an_error() -> None:
    def short(completions: list[Messages]) -> list[float]:
        return [1.0]

    scores = await Rubric([short]).score_group(group("a", "b", "c"))
    assert all(s.reward is None for s in scores)
    assert all(s.error is not None and "3 rollouts" in s.error.message for s in scores)


# --- RubricGroup ----------------------------------------------------------------------


async def test_rubric_group_runs_rubrics_concurrently_and_sums() -> None:
    in_flight = InFlight()

    async def slow_a(state: State) -> float:
        await in_flight.hold()
        return 1.0

    async def slow_b(state: State) -> float:
        await in_flight.hold()
        return 0.5

    rubric = RubricGroup([Rubric([slow_a]), Rubric([slow_b], weights=[2.0])])
    scores = await rubric.score_group(group("a", "b"))
    assert in_flight.most == 4, f"sub-rubrics ran sequentially ({in_flight.most} at once)"
    assert [s.reward for s in scores] == [2.0, 2.0]
    assert scores[0].metrics == {"slow_a": 1.0, "slow_b": 0.5}


async def test_rubric_group_prefixes_clashing_metric_names() -> None:
    def correct(answer: str) -> float:
        return 1.0

    def other_correct(answer: str) -> float:
        return 0.0

    other_correct.__name__ = "correct"

    def unique() -> float:
        return 3.0

    rubric = RubricGroup([Rubric([correct]), Rubric([other_correct, unique], weights=[1, 0])])
    [score] = await rubric.score_group([make_state()])
    assert score.metrics == {"0/correct": 1.0, "1/correct": 0.0, "unique": 3.0}
    assert rubric.reward_func_names == ["0/correct", "1/correct", "unique"]
    assert score.reward == 1.0


async def test_rubric_group_error_in_one_rubric_gives_none_with_that_error() -> None:
    def good() -> float:
        return 1.0

    def bad() -> float:
        raise ValueError("nope")

    [score] = await RubricGroup([Rubric([good]), Rubric([bad])]).score_group([make_state()])
    assert score.reward is None
    assert score.error is not None
    assert "bad" in score.error.message
    assert score.metrics == {"good": 1.0}


# --- MathRubric -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "text", "expected"),
    [
        ("0.5", "so \\boxed{\\frac{1}{2}}", 1.0),
        ("\\frac{1}{2}", "\\boxed{0.5}", 1.0),
        ("2x+1", "<think>expand</think> \\boxed{1+2x}", 1.0),
        ("3", "\\boxed{4}", 0.0),
        ("3", "<think>\\boxed{3} maybe", 0.0),  # unclosed reasoning: no answer
        ("3", "", 0.0),
        ("3", "\\boxed{)(*&}", 0.0),  # unparseable is a score, not an error
    ],
)
async def test_math_rubric(answer: str, text: str, expected: float) -> None:
    [score] = await MathRubric().score_group([make_state(text, answer)])
    assert score.error is None
    assert score.reward == expected
    assert score.metrics == {"correct_answer": expected}


def test_math_rubric_works_off_the_main_thread() -> None:
    rubric = MathRubric()
    states = [
        make_state("\\boxed{\\frac{1}{2}}", "0.5", 0),
        make_state("\\boxed{1+2x}", "2x+1", 1),
        make_state("\\boxed{7}", "2x+1", 2),
    ]
    results: list[Any] = []

    def worker() -> None:
        assert threading.current_thread() is not threading.main_thread()
        results.append(asyncio.run(rubric.score_group(states)))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(timeout=60)
    [scores] = results
    assert [s.error for s in scores] == [None, None, None]
    assert [s.reward for s in scores] == [1.0, 1.0, 0.0]


# --- ToolMetricsRubric ----------------------------------------------------------------


async def test_tool_metrics_rubric() -> None:
    rubric = ToolMetricsRubric(tool_names=["search", "calc"])
    stats = {"calls": 3, "errors": 1, "per_tool": {"search": 2, "other": 1}}
    scores = await rubric.score_group([make_state(tool_stats=stats), make_state()])
    assert scores[0].reward == 0.0
    assert scores[0].metrics == {
        "total_tool_calls": 3.0,
        "tool_errors": 1.0,
        "tool_calls/search": 2.0,
        "tool_calls/calc": 0.0,
    }
    assert set(scores[1].metrics.values()) == {0.0}
    assert rubric.metric_names == [
        "total_tool_calls",
        "tool_errors",
        "tool_calls/search",
        "tool_calls/calc",
    ]


# --- JudgeRubric ----------------------------------------------------------------------


async def test_judge_formats_template_and_scores_yes() -> None:
    client = ScriptedClient(["Yes, correct.", "**No**, although it says yes."])
    rubric = JudgeRubric(
        client,
        judge_model="judge-m",
        judge_prompt="Q={question}|A={answer}|R={response}|{{literal}}",
        judge_sampling_args={"temperature": 0},
        parser=XMLParser(["think", "answer"]),
    )
    states = [
        make_state("<think>t</think><answer>4</answer>", "4", 0),
        make_state("<answer>5</answer>", "4", 1),
    ]
    scores = await rubric.score_group(states)
    assert [s.reward for s in scores] == [1.0, 0.0]
    first = client.calls[0]
    assert first["model"] == "judge-m"
    assert first["sampling_args"] == {"temperature": 0}
    assert first["messages"] == [{"role": "user", "content": "Q=What is 2+2?|A=4|R=4|{literal}"}]
    assert client.calls[1]["messages"][0]["content"] == "Q=What is 2+2?|A=4|R=5|{literal}"
    assert states[0]["judge_response"] == "Yes, correct."
    assert scores[0].metrics == {"judge_reward": 1.0}


async def test_judge_honours_max_concurrent() -> None:
    active = 0
    peak = 0

    async def respond(messages: Messages, tools: Any) -> str:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.02)
        active -= 1
        return "yes"

    client = ScriptedClient(respond)
    rubric = JudgeRubric(client, max_concurrent=2)
    scores = await rubric.score_group(group(*[f"answer {i}" for i in range(8)]))
    assert [s.reward for s in scores] == [1.0] * 8
    assert len(client.calls) == 8
    assert peak == 2


async def test_judge_retries_transient_error_then_succeeds() -> None:
    client = ScriptedClient([ConnectionError("reset"), TimeoutError("slow"), "yes"])
    rubric = JudgeRubric(client, max_retries=3, retry_base_delay=0.001)
    [score] = await rubric.score_group([make_state()])
    assert score.error is None
    assert score.reward == 1.0
    assert len(client.calls) == 3


async def test_judge_gives_up_after_max_retries_and_records_error() -> None:
    client = ScriptedClient([ConnectionError("down")], cycle=True)
    rubric = JudgeRubric(client, max_retries=2, retry_base_delay=0.001)
    [score] = await rubric.score_group([make_state()])
    assert len(client.calls) == 3  # first try + 2 retries
    assert score.reward is None
    assert score.error is not None
    assert score.error.type == "ConnectionError"
    assert "judge_reward" in score.error.message


async def test_judge_does_not_retry_non_transient_errors() -> None:
    client = ScriptedClient([ValueError("bad request"), "yes"])
    rubric = JudgeRubric(client, retry_base_delay=0.001)
    [score] = await rubric.score_group([make_state()])
    assert len(client.calls) == 1
    assert score.reward is None


async def test_judge_cache_hit_makes_no_call() -> None:
    cache = InMemoryJudgeCache()
    first = ScriptedClient(["yes"])
    states = [make_state("4", "4")]
    await JudgeRubric(first, cache=cache).score_group(states)
    assert len(first.calls) == 1
    assert len(cache) == 1

    second = ScriptedClient([])  # raises if called at all
    [score] = await JudgeRubric(second, cache=cache).score_group([make_state("4", "4")])
    assert second.calls == []
    assert score.reward == 1.0
    assert cache.hits == 1

    # A different judge model is a different key: no stale hit.
    third = ScriptedClient(["no"])
    [score] = await JudgeRubric(third, judge_model="other", cache=cache).score_group(
        [make_state("4", "4")]
    )
    assert len(third.calls) == 1
    assert score.reward == 0.0


async def test_cache_key_depends_on_every_input() -> None:
    rubric = JudgeRubric(judge_sampling_args={"temperature": 0, "top_p": 1})
    same = JudgeRubric(judge_sampling_args={"top_p": 1, "temperature": 0})
    key = rubric.cache_key("q", "r", "a")
    assert key == same.cache_key("q", "r", "a")  # argument order does not matter
    assert len({key, rubric.cache_key("q", "r", "b"), rubric.cache_key("q", "rx", "a")}) == 3
    assert key != JudgeRubric(judge_prompt="{response}").cache_key("q", "r", "a")


async def test_custom_judge_function_and_shared_call() -> None:
    client = ScriptedClient(["YES"])
    rubric = JudgeRubric(client, funcs=[])

    async def strict(
        judge: Any, prompt: Messages, completion: Messages, answer: str, state: State
    ) -> float:
        return 1.0 if (await judge(prompt, completion, answer, state)) == "YES" else 0.0

    async def loose(
        judge: Any, prompt: Messages, completion: Messages, answer: str, state: State
    ) -> float:
        return 0.5 if "yes" in (await judge(prompt, completion, answer, state)).lower() else 0.0

    rubric.add_reward_func(strict)
    rubric.add_reward_func(loose)
    [score] = await rubric.score_group([make_state()])
    assert score.reward == 1.5
    assert len(client.calls) == 1  # both functions shared one judge call


async def test_judge_without_client_raises_a_clear_error() -> None:
    rubric = JudgeRubric()
    [score] = await rubric.score_group([make_state()])
    assert score.reward is None
    assert score.error is not None
    assert "judge_client" in score.error.message


def test_invalid_judge_template_is_rejected() -> None:
    with pytest.raises(VfopsError, match="template"):
        JudgeRubric(judge_prompt="{question} {unknown}")


def test_rubric_default_parser() -> None:
    assert isinstance(Rubric().parser, Parser)
    assert math.isclose(sum(Rubric().reward_weights), 0.0)
