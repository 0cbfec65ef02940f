"""Tool-using environments with native (OpenAI) tool calls."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Collection
from typing import Any

import orjson

from vfops._errors import SandboxError
from vfops._tool_counts import count_tool_call, start_tool_counts
from vfops._types import Message, Messages, State
from vfops.envs._environment import Scorer
from vfops.envs._multiturn import MultiTurnEnv
from vfops.envs._tool_schema import tool_schema
from vfops.rubrics import Rubric, RubricGroup, ToolMetricsRubric

Tool = Callable[..., Any]


class ToolEnv(MultiTurnEnv):
    """The model calls Python functions through native tool calls.

    Schemas are generated from each tool's signature and docstring. A rollout
    ends when the model answers without tool calls (or at ``max_turns``). A tool
    that raises, an unknown tool name or arguments that are not valid JSON are
    reported back to the model as the tool message's content: the model can
    recover, and the rollout does not crash; each counts as a tool error. Tool-call
    counts are added to the metrics (``total_tool_calls``, ``tool_errors``,
    ``tool_calls/<name>``), and the state carries ``tool_calls``, ``tool_errors`` and
    ``first_tool_error`` (:mod:`vfops._tool_counts`), which the run's summary adds up.
    """

    def __init__(
        self,
        *,
        tools: list[Tool] | None = None,
        max_turns: int = 10,
        rubric: Rubric | None = None,
        **kwargs: Any,
    ) -> None:
        self.tools: dict[str, Tool] = {}
        self._schemas: dict[str, dict[str, Any]] = {}
        self._skipped_args: dict[str, tuple[str, ...]] = {}
        self._scoring_rubric: Rubric | RubricGroup | None = None
        for tool in tools or []:
            self.add_tool(tool)
        super().__init__(max_turns=max_turns, rubric=rubric, **kwargs)

    def add_tool(self, tool: Tool, *, args_to_skip: Collection[str] = ()) -> None:
        name = tool.__name__
        self.tools[name] = tool
        self._skipped_args[name] = tuple(args_to_skip)
        self._schemas[name] = tool_schema(tool, skip=args_to_skip)
        self._scoring_rubric = None  # rebuilt so the new tool gets its metric

    def rubric_for(self, task: str) -> Scorer:
        # The user's rubric plus tool-call metrics, scored concurrently.
        if self._scoring_rubric is None:
            self._scoring_rubric = RubricGroup(
                [self.rubric, ToolMetricsRubric(tool_names=list(self.tools))]
            )
        return self._scoring_rubric

    def tool_schemas(self, state: State) -> list[dict[str, Any]] | None:
        return list(self._schemas.values()) or None

    async def setup_state(self, state: State) -> State:
        state["tool_stats"] = {"calls": 0, "errors": 0, "per_tool": {}}
        start_tool_counts(state)
        return await super().setup_state(state)

    async def is_completed(self, messages: Messages, state: State) -> bool:
        if await super().is_completed(messages, state):
            return True
        return not messages[-1].get("tool_calls")

    async def env_response(self, messages: Messages, state: State) -> Messages:
        calls = messages[-1].get("tool_calls") or []
        results = await asyncio.gather(*(self._run_call(call, messages, state) for call in calls))
        return list(results)

    def update_tool_args(
        self, tool_name: str, tool_args: dict[str, Any], messages: Messages, state: State
    ) -> dict[str, Any]:
        """Hook for StatefulToolEnv: add hidden arguments from the rollout state."""
        return tool_args

    async def _run_call(self, call: dict[str, Any], messages: Messages, state: State) -> Message:
        function = call.get("function") or {}
        name = function.get("name", "")
        stats = state["tool_stats"]
        stats["calls"] += 1
        stats["per_tool"][name] = stats["per_tool"].get(name, 0) + 1
        try:
            content = await self._call_tool(name, function.get("arguments"), messages, state)
        except SandboxError:
            raise  # the machinery failed, not the model: the rollout is an error
        except Exception as exc:  # reported to the model, not raised: it may recover
            stats["errors"] += 1
            content = f"Error: {type(exc).__name__}: {exc}"
            count_tool_call(state, f"{name}: {type(exc).__name__}: {exc}")
        else:
            count_tool_call(state)
        return {"role": "tool", "tool_call_id": call.get("id", ""), "content": content}

    async def _call_tool(
        self, name: str, raw_arguments: Any, messages: Messages, state: State
    ) -> str:
        tool = self.tools.get(name)
        if tool is None:
            raise LookupError(f"unknown tool '{name}'; available: {', '.join(self.tools)}")
        arguments = _decode_arguments(raw_arguments)
        arguments = self.update_tool_args(name, arguments, messages, state)
        if inspect.iscoroutinefunction(tool):
            result = await tool(**arguments)
        else:
            result = tool(**arguments)
        return result if isinstance(result, str) else orjson.dumps(result, default=str).decode()


def _decode_arguments(raw: Any) -> dict[str, Any]:
    # ValueError, as verifiers raises it: the model reads "Error: ValueError: ..." back
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    try:
        decoded = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"tool arguments are not valid JSON: {exc}") from exc
    if not isinstance(decoded, dict):
        raise ValueError("tool arguments must be a JSON object")
    return decoded


class StatefulToolEnv(ToolEnv):
    """A ToolEnv whose tools take hidden arguments injected from rollout state.

    ``add_tool(f, args_to_skip=["session_id"])`` hides ``session_id`` from the
    schema the model sees; override :meth:`update_tool_args` to fill it in.
    """

    def update_tool_args(
        self, tool_name: str, tool_args: dict[str, Any], messages: Messages, state: State
    ) -> dict[str, Any]:
        raise NotImplementedError(
            f"{type(self).__name__} must implement update_tool_args to inject hidden arguments"
        )
