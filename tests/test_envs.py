"""Environment logic with the scripted client: datasets, turns, tools, groups."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from datasets import Dataset

from vfops._errors import DatasetFormatError
from vfops._types import Messages, State
from vfops.clients import ChatResponse, PromptTooLongError, ScriptedClient
from vfops.envs import EnvGroup, MultiTurnEnv, SingleTurnEnv, StatefulToolEnv, ToolEnv
from vfops.envs._dataset import Example
from vfops.parsers import XMLParser
from vfops.rubrics import Rubric


def qa(n: int = 3) -> Dataset:
    return Dataset.from_list([{"question": f"q{i}", "answer": str(i)} for i in range(n)])


def exact(completion: Messages, answer: str) -> float:
    return 1.0 if completion[-1]["content"] == answer else 0.0


# --- datasets ---------------------------------------------------------------------
def test_question_becomes_messages_with_system_prompt_and_few_shot() -> None:
    few_shot = [{"role": "user", "content": "q?"}, {"role": "assistant", "content": "a"}]
    env = SingleTurnEnv(eval_dataset=qa(2), system_prompt="sys", few_shot=few_shot)
    row = env.get_eval_dataset()[1]
    assert row["prompt"] == [
        {"role": "system", "content": "sys"},
        *few_shot,
        {"role": "user", "content": "q1"},
    ]
    assert row["example_id"] == 1 and row["answer"] == "1" and row["task"] == "default"


def test_prompt_rows_keep_their_messages_and_ids_and_info() -> None:
    data = Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": "hi"}],
                "example_id": 42,
                "info": {"level": 3},
                "task": "greet",
            }
        ]
    )
    env = SingleTurnEnv(eval_dataset=data)
    (example,) = list(env.iter_eval_examples())
    assert example == Example(
        example_id=42,
        prompt=[{"role": "user", "content": "hi"}],
        answer="",
        info={"level": 3},
        task="greet",
    )


def test_dataset_without_prompt_or_question_is_a_clear_error() -> None:
    env = SingleTurnEnv(eval_dataset=Dataset.from_list([{"text": "x"}]), name="bad")
    with pytest.raises(DatasetFormatError, match="neither a 'prompt' nor a 'question'"):
        _ = env.eval_dataset


def test_dataset_builder_is_lazy() -> None:
    calls = []

    def build() -> Dataset:
        calls.append(1)
        return qa(2)

    env = SingleTurnEnv(eval_dataset=build)
    assert calls == []
    assert len(env.get_eval_dataset()) == 2
    assert len(env.get_eval_dataset(n=1)) == 1
    assert calls == [1]


def test_plain_rows_and_a_dataset_give_the_same_examples_sizes_and_datasets() -> None:
    few_shot = [{"role": "user", "content": "q?"}, {"role": "assistant", "content": "a"}]
    question_rows = [
        {"question": f"q{i}", "answer": i, "info": {"level": i, "tags": ["x"]}} for i in range(5)
    ]
    prompt_rows = [
        {
            "prompt": [{"role": "user", "content": f"hi {i}"}],
            "example_id": 40 + i,
            "task": "greet",
            "extra": "dropped",
        }
        for i in range(3)
    ]
    for rows in (question_rows, prompt_rows):
        plain = SingleTurnEnv(eval_dataset=rows, system_prompt="sys", few_shot=few_shot)
        arrow = SingleTurnEnv(
            eval_dataset=Dataset.from_list(rows), system_prompt="sys", few_shot=few_shot
        )
        assert list(plain.iter_eval_examples()) == list(arrow.iter_eval_examples())
        assert list(plain.iter_eval_examples(2)) == list(arrow.iter_eval_examples(2))
        assert plain.eval_size() == arrow.eval_size() == len(rows)
        # the public Dataset views agree too (converted from the plain rows)
        assert plain.eval_dataset is not None and arrow.eval_dataset is not None
        assert plain.eval_dataset.to_list() == arrow.eval_dataset.to_list()
        assert plain.get_eval_dataset(n=2).to_list() == arrow.get_eval_dataset(n=2).to_list()


def test_plain_rows_build_lazily_and_fall_back_to_train() -> None:
    calls = []

    def build() -> list[dict[str, Any]]:
        calls.append(1)
        return [{"question": f"q{i}", "answer": str(i)} for i in range(4)]

    env = SingleTurnEnv(dataset=build)
    assert calls == []
    assert env.eval_size() == 4
    assert [e.answer for e in env.iter_eval_examples(3)] == ["0", "1", "2"]
    assert env.dataset is env.eval_dataset  # one Dataset, converted once
    assert list(env.splits()) == ["train"] and len(env.get_dataset(n=2)) == 2
    assert calls == [1]


def test_plain_rows_are_checked_once_and_formatted_on_each_read() -> None:
    raw = [{"question": f"q{i}", "answer": i, "info": {"i": i}} for i in range(5)]
    env = SingleTurnEnv(eval_dataset=raw, system_prompt="sys")
    split = env._formatted_split("eval")
    assert split is not None and not isinstance(split, list)  # no second copy of the rows
    first = split[0]
    assert first == {
        "prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": "q0"}],
        "answer": "0",
        "info": '{"i":0}',
        "task": "default",
        "example_id": 0,
    }
    first["prompt"].append({"role": "user", "content": "changed by a reader"})
    assert len(split[0]["prompt"]) == 2  # each read is its own copy
    assert split[-1] == split[4] and split[1:3] == list(split)[1:3]
    assert [row["example_id"] for row in split] == [0, 1, 2, 3, 4]
    with pytest.raises(IndexError):
        split[5]
    assert raw[0] == {"question": "q0", "answer": 0, "info": {"i": 0}}  # the source untouched


def _held_bytes(make_env: Any) -> int:
    """What an environment's built eval split keeps (Python allocations, after the build)."""
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        env = make_env()
        assert env.eval_size() == 20_000
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return held


def test_rows_a_builder_returned_are_held_packed_and_read_back_the_same() -> None:
    def rows() -> list[dict[str, Any]]:
        return [
            {"question": f"What is {i} + 7?", "answer": str(i + 7), "info": {"a": i, "op": "+"}}
            for i in range(20_000)
        ]

    given = rows()
    built = SingleTurnEnv(eval_dataset=rows, system_prompt="sys")
    held = SingleTurnEnv(eval_dataset=given, system_prompt="sys")
    assert list(built.iter_eval_examples()) == list(held.iter_eval_examples())
    split, as_given = built._formatted_split("eval"), held._formatted_split("eval")
    assert split is not None and as_given is not None
    assert split[19_999] == as_given[19_999] and split[-2:] == list(as_given)[-2:]
    # the builder's rows (dicts: ~500 bytes each) are held as their JSON (~80): a split
    # of 20,000 rows keeps ~2 MB where the rows themselves are ~10
    packed = _held_bytes(lambda: SingleTurnEnv(eval_dataset=rows))
    unpacked = _held_bytes(lambda: SingleTurnEnv(eval_dataset=rows()))  # the env holds them
    assert unpacked > 8_000_000 and packed < unpacked / 3, (packed, unpacked)


def test_rows_that_json_would_change_are_held_as_they_are() -> None:
    odd = [{"question": "q", "answer": "a", "info": {"pair": (1, 2)}}]  # a tuple: a list in JSON
    env = SingleTurnEnv(eval_dataset=lambda: odd)
    assert env.eval_size() == 1
    split = env._formatted_split("eval")
    assert split is not None and split._rows is odd  # type: ignore[union-attr]


def test_plain_rows_keep_the_dataset_errors() -> None:
    def message(source: Any) -> str:
        env = SingleTurnEnv(eval_dataset=source, name="bad")
        with pytest.raises(DatasetFormatError) as caught:
            env.eval_size()
        return str(caught.value)

    for rows in ([{"text": "x"}], [], [{"question": "q"}, {"question": None}]):
        assert message(rows) == message(Dataset.from_list(rows))
    assert "neither a 'prompt' nor a 'question' column (columns: ['text'])" in message(
        [{"text": "x"}]
    )
    # a column is there when any row has it; a row lacking it is named
    assert message([{"text": "x"}, {"question": "q"}]) == (
        "row 0 of environment 'bad' has no 'prompt' or 'question'"
    )
    assert "row 1 of environment 'bad' is a str" in message([{"question": "q"}, "q2"])
    assert "is a str; give a datasets.Dataset, a list of row dicts" in message("q")


# --- single and multi turn ------------------------------------------------------------
async def test_single_turn_rollout_is_generated_and_scored() -> None:
    env = SingleTurnEnv(eval_dataset=qa(), rubric=Rubric(funcs=[exact]))
    (example,) = list(env.iter_eval_examples(1))
    client = ScriptedClient(["0", "wrong"])
    records = await env.run_group(client, "m", example, [0, 1], sampling_args={"temperature": 0})
    assert [r.reward for r in records] == [1.0, 0.0]
    assert [r.rollout_index for r in records] == [0, 1]
    assert all(r.stop_reason == "completed" and r.turns == 1 for r in records)
    assert records[0].sampling_args == {"temperature": 0}
    assert client.calls[0]["messages"] == example.prompt


class GuessEnv(MultiTurnEnv):
    """Guess the answer; the environment says higher/lower."""

    async def setup_state(self, state: State) -> State:
        state["target"] = int(state["answer"])
        return state

    async def is_completed(self, messages: Messages, state: State) -> bool:
        return messages[-1]["content"] == str(state["target"])

    async def env_response(self, messages: Messages, state: State) -> Messages:
        guess = int(messages[-1]["content"])
        hint = "higher" if guess < state["target"] else "lower"
        return [{"role": "user", "content": hint}]


async def test_multi_turn_feedback_until_solved() -> None:
    env = GuessEnv(eval_dataset=qa(3), max_turns=5, rubric=Rubric(funcs=[exact]))
    example = list(env.iter_eval_examples())[2]
    client = ScriptedClient(["0", "5", "2"])
    state = await env.rollout(client, "m", example)
    assert state["stop_reason"] == "completed" and state["turn"] == 3
    assert [m["content"] for m in state["completion"]] == ["0", "higher", "5", "lower", "2"]
    # the model saw the whole conversation on its last turn
    assert [m["content"] for m in client.calls[-1]["messages"]][-4:] == [
        "0",
        "higher",
        "5",
        "lower",
    ]


async def test_max_turns_stops_the_rollout() -> None:
    env = GuessEnv(eval_dataset=qa(3), max_turns=2)
    example = list(env.iter_eval_examples())[2]
    state = await env.rollout(ScriptedClient(["0"], cycle=True), "m", example)
    assert state["stop_reason"] == "max_turns" and state["turn"] == 2


async def test_length_finish_marks_truncation() -> None:
    env = GuessEnv(eval_dataset=qa(3))
    example = list(env.iter_eval_examples())[2]
    reply = ChatResponse(message={"role": "assistant", "content": "1"}, finish_reason="length")
    state = await env.rollout(ScriptedClient([reply]), "m", example)
    assert state["stop_reason"] == "length"


async def test_per_rollout_timeout() -> None:
    env = GuessEnv(eval_dataset=qa(3), timeout_seconds=0.1)
    example = list(env.iter_eval_examples())[2]
    state = await env.rollout(ScriptedClient(["0"], cycle=True, delay_s=0.06), "m", example)
    assert state["stop_reason"] == "timeout"
    assert 1 <= state["turn"] <= 2


async def test_model_error_is_recorded_as_generation_error_and_not_scored() -> None:
    env = SingleTurnEnv(eval_dataset=qa(), rubric=Rubric(funcs=[exact]))
    (example,) = list(env.iter_eval_examples(1))
    client = ScriptedClient([ConnectionError("server down")])
    (record,) = await env.run_group(client, "m", example, [0])
    assert record.stop_reason == "error" and record.reward is None
    assert record.error is not None
    assert (record.error.type, record.error.stage) == ("ConnectionError", "generation")


async def test_environment_error_is_tagged_environment() -> None:
    class Broken(MultiTurnEnv):
        async def env_response(self, messages: Messages, state: State) -> Messages:
            raise KeyError("board")

    env = Broken(eval_dataset=qa())
    (example,) = list(env.iter_eval_examples(1))
    state = await env.rollout(ScriptedClient(["x"]), "m", example)
    assert state["stop_reason"] == "error"
    assert (state["error"].type, state["error"].stage) == ("KeyError", "environment")


async def test_prompt_too_long_stops_cleanly() -> None:
    env = SingleTurnEnv(eval_dataset=qa())
    (example,) = list(env.iter_eval_examples(1))
    state = await env.rollout(ScriptedClient([PromptTooLongError("ctx")]), "m", example)
    assert state["stop_reason"] == "prompt_too_long" and state["error"] is None


async def test_early_stop_from_env_response_sets_done() -> None:
    class OneHint(MultiTurnEnv):
        async def env_response(self, messages: Messages, state: State) -> Messages:
            state["done"] = True
            return [{"role": "user", "content": "game over"}]

    env = OneHint(eval_dataset=qa(), max_turns=10)
    (example,) = list(env.iter_eval_examples(1))
    state = await env.rollout(ScriptedClient(["a"], cycle=True), "m", example)
    assert state["stop_reason"] == "completed" and state["turn"] == 1
    assert state["completion"][-1]["content"] == "game over"


# --- tools ----------------------------------------------------------------------------
def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Args:
        a: the first addend
        b: the second addend,
            defaulting to zero
    """
    return a + b


def divide(a: float, b: float) -> float:
    """Divide a by b."""
    return a / b


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_tool_schema_from_signature_and_docstring() -> None:
    env = ToolEnv(eval_dataset=qa(), tools=[add])
    (schema,) = env.tool_schemas({}) or []
    assert schema == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "the first addend"},
                    "b": {
                        "type": "integer",
                        "description": "the second addend, defaulting to zero",
                    },
                },
                "required": ["a"],
            },
        },
    }


async def test_tool_calls_run_and_errors_go_back_to_the_model() -> None:
    env = ToolEnv(eval_dataset=qa(), tools=[add, divide], rubric=Rubric(funcs=[exact]))
    (example,) = list(env.iter_eval_examples(1))
    script: list[Any] = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                tool_call("c1", "add", '{"a": 2, "b": 3}'),
                tool_call("c2", "divide", '{"a": 1, "b": 0}'),
                tool_call("c3", "nope", "{}"),
                tool_call("c4", "add", "{not json"),
            ],
        },
        "0",
    ]
    client = ScriptedClient(script)
    (record,) = await env.run_group(client, "m", example, [0])
    tool_messages = [m for m in record.completion if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["c1", "c2", "c3", "c4"]
    assert tool_messages[0]["content"] == "5"
    assert tool_messages[1]["content"].startswith("Error: ZeroDivisionError")
    assert "unknown tool 'nope'" in tool_messages[2]["content"]
    assert "not valid JSON" in tool_messages[3]["content"]
    assert record.stop_reason == "completed" and record.reward == 1.0
    assert record.metrics["total_tool_calls"] == 4
    assert record.metrics["tool_errors"] == 3
    assert client.calls[0]["tools"] == env.tool_schemas({})


class SessionTools(StatefulToolEnv):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_tool(self.lookup, args_to_skip=["session"])

    @staticmethod
    def lookup(key: str, session: dict[str, str]) -> str:
        """Look a key up in the session store."""
        return session.get(key, "missing")

    async def setup_state(self, state: State) -> State:
        state = await super().setup_state(state)
        state["session"] = {"color": f"blue-{state['example_id']}"}
        return state

    def update_tool_args(
        self, tool_name: str, tool_args: dict[str, Any], messages: Messages, state: State
    ) -> dict[str, Any]:
        return {**tool_args, "session": state["session"]}


async def test_stateful_tool_hides_and_injects_arguments() -> None:
    env = SessionTools(eval_dataset=qa())
    (schema,) = env.tool_schemas({}) or []
    assert list(schema["function"]["parameters"]["properties"]) == ["key"]
    example = list(env.iter_eval_examples())[1]
    script: list[Any] = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [tool_call("t", "lookup", '{"key": "color"}')],
        },
        "done",
    ]
    state = await env.rollout(ScriptedClient(script), "m", example)
    assert state["completion"][1]["content"] == "blue-1"


# --- groups ----------------------------------------------------------------------------
@pytest.mark.parametrize("kinds", [("dataset", "dataset"), ("rows", "rows"), ("rows", "dataset")])
async def test_env_group_routes_rows_and_scores_with_each_rubric(kinds: tuple[str, str]) -> None:
    def always_one() -> float:
        return 1.0

    def always_half() -> float:
        return 0.5

    def data(kind: str, n: int) -> Any:
        return qa(n) if kind == "dataset" else qa(n).to_list()

    first = SingleTurnEnv(eval_dataset=data(kinds[0], 2), rubric=Rubric(funcs=[always_one]))
    second = GuessEnv(eval_dataset=data(kinds[1], 3), rubric=Rubric(funcs=[always_half]))
    group = EnvGroup([first, second], env_names=["single", "guess"])
    examples = list(group.iter_eval_examples())
    assert group.eval_size() == 5
    assert group.eval_dataset is not None
    assert group.eval_dataset["task"] == ["single", "guess", "single", "guess", "guess"]
    # interleaved, so the first N examples (-n) cover every member
    assert [e.task for e in examples] == ["single", "guess", "single", "guess", "guess"]
    assert [e.example_id for e in examples] == [0, 1, 2, 3, 4]
    assert [e.answer for e in examples] == ["0", "0", "1", "1", "2"]
    client = ScriptedClient(lambda messages, tools: messages[-1]["content"][1:] or "0")
    rewards = {}
    for example in (examples[0], examples[3]):
        (record,) = await group.run_group(client, "m", example, [0])
        rewards[record.task] = (record.reward, set(record.metrics))
    assert rewards == {"single": (1.0, {"always_one"}), "guess": (0.5, {"always_half"})}


class _CountingClient(ScriptedClient):
    """Counts how many chats overlap: concurrency observed, not timed."""

    now = most = 0

    async def chat(self, **kwargs: Any) -> ChatResponse:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            return await super().chat(**kwargs)
        finally:
            self.now -= 1


async def test_group_rollouts_run_concurrently_under_the_limiter() -> None:
    env = SingleTurnEnv(eval_dataset=qa())
    (example,) = list(env.iter_eval_examples(1))
    client = _CountingClient(["x"], cycle=True, delay_s=0.05)
    await env.run_group(client, "m", example, range(4), limiter=asyncio.Semaphore(2))
    # two at a time: not four in a row (1) nor all at once (4)
    assert (len(client.calls), client.most) == (4, 2)


def test_xml_environment_uses_its_parser() -> None:
    parser = XMLParser(["answer"])
    env = SingleTurnEnv(eval_dataset=qa(), parser=parser)
    assert env.parser is parser
