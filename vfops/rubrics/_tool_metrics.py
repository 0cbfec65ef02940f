"""Metrics of tool use (weight 0): how many calls, errors, and calls per tool."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vfops._types import State
from vfops.rubrics._rubric import Rubric


def _stats(state: State) -> dict[str, object]:
    stats = state.get("tool_stats")
    return stats if isinstance(stats, dict) else {}


def total_tool_calls(state: State) -> float:
    """Tool calls made in the rollout (0 for states without ``tool_stats``)."""
    return float(_stats(state).get("calls", 0) or 0)  # type: ignore[arg-type]


def tool_errors(state: State) -> float:
    """Tool calls that raised or were malformed."""
    return float(_stats(state).get("errors", 0) or 0)  # type: ignore[arg-type]


def _per_tool_metric(tool_name: str) -> Callable[[State], float]:
    def count(state: State) -> float:
        per_tool = _stats(state).get("per_tool")
        if not isinstance(per_tool, dict):
            return 0.0
        return float(per_tool.get(tool_name, 0) or 0)

    count.__name__ = count.__qualname__ = f"tool_calls/{tool_name}"
    return count


class ToolMetricsRubric(Rubric):
    """Records ``total_tool_calls``, ``tool_errors`` and ``tool_calls/<name>`` (weight 0).

    Per-tool metric names must be known up front, so pass ``tool_names`` (or call
    :meth:`add_tool`); calls to tools not named are only counted in the total.
    """

    def __init__(self, tool_names: Sequence[str] = ()) -> None:
        super().__init__()
        self.add_metric(total_tool_calls)
        self.add_metric(tool_errors)
        for name in tool_names:
            self.add_tool(name)

    def add_tool(self, tool_name: str) -> None:
        """Add the metric ``tool_calls/<tool_name>``."""
        self.add_metric(_per_tool_metric(tool_name))
