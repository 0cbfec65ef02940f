"""Tool calls and tool errors of a rollout: the keys a final state carries, counted once.

Whatever runs tools for a rollout (vfops's ``ToolEnv``, the ``verifiers`` adapters'
harnesses) may put three keys in the rollout's final state: :data:`TOOL_CALLS` (calls
run), :data:`TOOL_ERRORS` (those that raised or returned an error result) and
:data:`FIRST_TOOL_ERROR` (the first error's message, or ``None``). The rollout record
turns them into the metrics of the same names and the first message into its ``info``;
a run's summary adds them up. A run whose tool calls all fail must never look like a
run of a weak model: these counts are how it is told apart.
"""

from __future__ import annotations

from typing import Final

from vfops._types import State

__all__ = [
    "FIRST_TOOL_ERROR",
    "FIRST_TOOL_ERROR_CHARS",
    "TOOL_CALLS",
    "TOOL_COUNT_METRICS",
    "TOOL_ERRORS",
    "count_tool_call",
    "first_tool_error",
    "start_tool_counts",
    "tool_count_metrics",
]

TOOL_CALLS: Final = "tool_calls"
TOOL_ERRORS: Final = "tool_errors"
FIRST_TOOL_ERROR: Final = "first_tool_error"
TOOL_COUNT_METRICS: Final = (TOOL_CALLS, TOOL_ERRORS)
"""The metrics vfops adds to a rollout that ran tools (not the environment's own: a
comparison with another library's metrics leaves them out)."""
FIRST_TOOL_ERROR_CHARS: Final = 2000
"""A first tool error's message is cut here (it is stored with every rollout)."""


def start_tool_counts(state: State) -> None:
    """No tool call yet: the rollout's state says so (0 calls is a count too)."""
    state[TOOL_CALLS] = 0
    state[TOOL_ERRORS] = 0
    state[FIRST_TOOL_ERROR] = None


def count_tool_call(state: State, error: str | None = None) -> None:
    """One tool call run; ``error``: its error message when it failed."""
    state[TOOL_CALLS] = int(state.get(TOOL_CALLS) or 0) + 1
    if error is None:
        return
    state[TOOL_ERRORS] = int(state.get(TOOL_ERRORS) or 0) + 1
    if state.get(FIRST_TOOL_ERROR) is None:
        state[FIRST_TOOL_ERROR] = error[:FIRST_TOOL_ERROR_CHARS]


def tool_count_metrics(state: State) -> dict[str, float]:
    """The counts ``state`` carries, as metrics (none when it carries none)."""
    metrics: dict[str, float] = {}
    for key in TOOL_COUNT_METRICS:
        value = state.get(key)
        # bool is an int, but True is no count
        if isinstance(value, int | float) and not isinstance(value, bool):
            metrics[key] = float(value)
    return metrics


def first_tool_error(state: State) -> str | None:
    """The first tool error's message ``state`` carries (cut to
    :data:`FIRST_TOOL_ERROR_CHARS`), or ``None``."""
    message = state.get(FIRST_TOOL_ERROR)
    if message is None:
        return None
    return str(message)[:FIRST_TOOL_ERROR_CHARS]
