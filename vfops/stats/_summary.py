"""Streaming summary statistics: memory constant in the number of rollouts.

Only per-example pass counts are kept (needed for pass@k), never the rollouts.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from vfops._rollout import RolloutRecord
from vfops._tool_counts import FIRST_TOOL_ERROR, TOOL_CALLS, TOOL_ERRORS

ERROR_EXAMPLE_CHARS = 500
_PASSES_MASK = (1 << 32) - 1  # the passing rollouts' part of a packed count
"""An error kind's example message is cut here (it is stored with the run's summary)."""
WARNING_ERROR_CHARS = 300
"""The first tool error, quoted in :meth:`EvalSummary.tool_warning`'s one line, is cut here."""


@dataclass(slots=True)
class RunningMean:
    """Welford's online mean and variance."""

    count: int = 0
    mean: float = 0.0
    _m2: float = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self._m2 += delta * (value - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self._m2 / (self.count - 1)) if self.count > 1 else 0.0

    @property
    def stderr(self) -> float:
        return self.std / math.sqrt(self.count) if self.count > 1 else 0.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate from n samples with c correct (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass
class EvalSummary:
    """Aggregates of a run, updated one rollout at a time."""

    pass_threshold: float = 1.0
    rollouts: int = 0
    new_rollouts: int = 0  # generated in this session (not read back on --resume)
    reward: RunningMean = field(default_factory=RunningMean)
    metrics: dict[str, RunningMean] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    error_examples: dict[str, str] = field(default_factory=dict)
    """The first message of each kind in ``errors``: the cause, not just a class name."""
    stop_reasons: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    """The sum of the rollouts' costs; ``None`` when none was priced ("unpriced")."""
    generation_ms: RunningMean = field(default_factory=RunningMean)
    wall_s: float = 0.0
    tool_calls: int = 0
    """Tool calls of the rollouts that counted theirs (metric ``tool_calls``)."""
    tool_errors: int = 0
    first_tool_error: str | None = None
    """The first failed tool call's message, of the first rollout that had one."""
    zero_rewards: int = 0
    """Scored rollouts whose reward is 0 (all of them: nothing the model did counted)."""
    agents: dict[str, RunningMean] = field(default_factory=dict)
    """Reward per agent (role) of episodes of several traces; empty for one agent."""
    agent_rollouts: Counter[str] = field(default_factory=Counter)
    # example_id -> rollouts << 32 | passing rollouts (errors count as failures), one
    # int per example: a [rollouts, passes] list each was ~4 MB more for 50,000 examples
    _passes: dict[int, int] = field(default_factory=dict)

    def add(self, record: RolloutRecord, *, new: bool = True) -> None:
        self.rollouts += 1
        self.new_rollouts += new
        if record.reward is not None:
            self.reward.add(record.reward)
            self.zero_rewards += record.reward == 0.0
        if record.agent:
            self._add_agent(record)
        metrics = record.metrics
        for name, value in metrics.items():
            mean = self.metrics.get(name)
            if mean is None:
                mean = self.metrics[name] = RunningMean()
            mean.add(value)
        calls = metrics.get(TOOL_CALLS)
        if calls is not None:  # the rollout counted its tool calls
            self._add_tool_counts(record, calls, metrics.get(TOOL_ERRORS, 0.0))
        if record.error is not None:
            kind = f"{record.error.stage}:{record.error.type}"
            self.errors[kind] += 1
            self.error_examples.setdefault(kind, record.error.message[:ERROR_EXAMPLE_CHARS])
        self.stop_reasons[record.stop_reason] += 1
        self.prompt_tokens += record.usage.prompt_tokens
        self.completion_tokens += record.usage.completion_tokens
        cost = record.usage.cost_usd
        if cost is not None:
            self.cost_usd = cost if self.cost_usd is None else self.cost_usd + cost
        self.generation_ms.add(record.timing.generation_ms)
        if record.reward is not None:  # an error is no attempt: pass@k is over scored ones
            passed = record.reward >= self.pass_threshold
            key = record.example_id
            self._passes[key] = self._passes.get(key, 0) + (1 << 32) + passed

    def _add_agent(self, record: RolloutRecord) -> None:
        self.agent_rollouts[record.agent] += 1
        mean = self.agents.get(record.agent)
        if mean is None:
            mean = self.agents[record.agent] = RunningMean()
        if record.reward is not None:
            mean.add(record.reward)

    def _add_tool_counts(self, record: RolloutRecord, calls: float, errors: float) -> None:
        self.tool_calls += int(calls)
        self.tool_errors += int(errors)
        if errors and self.first_tool_error is None:
            message = record.info.get(FIRST_TOOL_ERROR) if isinstance(record.info, dict) else None
            if message is not None:
                self.first_tool_error = str(message)[:ERROR_EXAMPLE_CHARS]

    @property
    def tool_error_rate(self) -> float:
        """The share of tool calls that failed (0 without tool calls)."""
        return self.tool_errors / self.tool_calls if self.tool_calls else 0.0

    def tool_warning(self) -> str | None:
        """One line when the run's tool calls say its scores are not the model's: most of
        them failed, or some failed and every scored rollout scored 0 (a tool server
        refusing every call reads like a weak model otherwise); ``None`` when neither."""
        if not self.tool_errors:
            return None
        most_failed = 2 * self.tool_errors > self.tool_calls
        all_zero = self.reward.count > 0 and self.zero_rewards == self.reward.count
        if not (most_failed or all_zero):
            return None
        line = f"{self.tool_errors} of {self.tool_calls} tool calls failed"
        if not most_failed:
            line = f"every rollout scored 0 and {line}"
        first = self.first_tool_error_line
        return f"{line} (first: {first})" if first else line

    @property
    def first_tool_error_line(self) -> str | None:
        """:attr:`first_tool_error` on one line, cut to quote in one."""
        if not self.first_tool_error:
            return None
        return _one_line(self.first_tool_error, WARNING_ERROR_CHARS)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def truncated_count(self) -> int:
        return self.stop_reasons.get("length", 0)

    def pass_at(self) -> dict[int, float]:
        """pass@k for k = 1, 2, 4, ... up to the smallest group size."""
        if not self._passes:
            return {}
        counts = [(packed >> 32, packed & _PASSES_MASK) for packed in self._passes.values()]
        smallest = min(n for n, _ in counts)
        result: dict[int, float] = {}
        k = 1
        while k <= smallest:
            values = [pass_at_k(n, c, k) for n, c in counts]
            result[k] = sum(values) / len(values)
            k *= 2
        return result

    def progress_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` of a run still running: without pass@k (a pass over every
        example, too slow to repeat while the rollouts run) and the timings (set at the
        end)."""
        stored = self._dict(pass_at={})
        for key in ("pass_at_k", "wall_s", "rollouts_per_s"):
            del stored[key]
        return stored

    def to_dict(self) -> dict[str, Any]:
        return self._dict(pass_at=self.pass_at())

    def _dict(self, *, pass_at: dict[int, float]) -> dict[str, Any]:
        return {
            "rollouts": self.rollouts,
            # nothing scored has no reward (None, shown as "-"), never a 0.0 that reads as one
            "scored": self.reward.count,
            "reward_mean": self.reward.mean if self.reward.count else None,
            "reward_std": self.reward.std if self.reward.count else None,
            "reward_stderr": self.reward.stderr if self.reward.count else None,
            "metrics": {name: m.mean for name, m in sorted(self.metrics.items())},
            "agents": {
                name: {
                    "rollouts": self.agent_rollouts[name],
                    "scored": m.count,
                    "reward_mean": m.mean if m.count else None,
                }
                for name, m in sorted(self.agents.items())
            },
            "pass_at_k": {str(k): v for k, v in pass_at.items()},
            "pass_threshold": self.pass_threshold,
            "errors": self.error_count,
            "errors_by_type": dict(self.errors),
            "error_examples": dict(self.error_examples),
            "truncated": self.truncated_count,
            "stop_reasons": dict(self.stop_reasons),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": self.cost_usd,
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
            "tool_error_rate": self.tool_error_rate,
            "first_tool_error": self.first_tool_error,
            "wall_s": self.wall_s,
            "rollouts_per_s": self.new_rollouts / self.wall_s if self.wall_s > 0 else 0.0,
        }


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
