"""What an evaluation returns and tells as it goes: :class:`EvalResult`, the progress hooks,
and :class:`RunOptions` (where and how a run is recorded).

A result says how the run ended (a status, and :meth:`EvalResult.outcome` in one
word); what a process exits with for each outcome is the CLI's business
(:mod:`vfops.cli._exit_codes`), not the library's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from vfops._errors import VfopsError
from vfops._rollout import RolloutRecord
from vfops.stats import EvalSummary

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

Action = Literal["created", "resumed", "reused"]
Existing = Literal["new", "resume", "reuse"]
Outcome = Literal["completed", "completed_with_errors", "interrupted", "failed", "budget_exhausted"]
DEFAULT_OUTPUT_ROOT = Path("outputs")
DEFAULT_MAX_ERROR_RATE: Final = 0.0
"""The share of errored rollouts above which a completed run is reported as
``completed_with_errors`` (``vfops eval --max-error-rate``): by default any error."""
DEFAULT_MAX_TOOL_ERROR_RATE: Final = 1.0
"""The share of failed tool calls above which a completed run is reported as
``completed_with_errors`` (``vfops eval --max-tool-error-rate``): by default none is
(the summary still warns when most failed)."""


@dataclass(frozen=True)
class RunOptions:
    """Where and how a run is recorded, and what it may spend: nothing here changes what
    the run measures (that is :class:`~vfops.evaluation.EvalRequest`, fingerprinted), so a
    new setting of this kind is one field here, not one more argument of
    :func:`~vfops.evaluation.evaluate_async`."""

    output_root: Path | None = None
    """Where a new run's folder goes (default :data:`DEFAULT_OUTPUT_ROOT`)."""
    resume: str | None = None
    """A run id, id prefix or run folder to finish."""
    existing: Existing = "new"
    """``resume``: the newest unfinished run with the same configuration fingerprint;
    ``reuse``: a completed one (nothing is generated); ``new``: always a new run."""
    registry: bool = True
    tracking: bool | None = None
    """MLflow (default: on unless ``VFOPS_TRACKING=0``; needs the registry)."""
    engine: Engine | None = None
    """The registry's engine (default: the default registry, in a child process)."""
    mlflow_parent_run_id: str | None = None
    max_cost: float | None = None
    """A cap on the run's spend in USD (its own ledger scope ``run:<id>``)."""
    cost_caps: Mapping[str, float | None] | None = None
    """Further ledger scopes the run spends against, shared with other runs (``None``:
    recorded without a cap)."""
    middleware: tuple[str, ...] = ()
    """Plug-in request middleware by name (``vfops.request_middleware`` entry points;
    ``vfops eval --middleware``), installed on the run's client for the run."""
    sinks: tuple[str, ...] = ()
    """Plug-in sinks by name (``vfops.eval_sinks`` entry points; ``vfops eval --sink``):
    each opened with the run's :class:`~vfops.evaluation.RunInfo`."""

    @property
    def capped(self) -> bool:
        return self.max_cost is not None or bool(self.cost_caps)


class RunEnded(VfopsError):
    """A run that did not complete (:meth:`EvalResult.raise_for_status`); ``outcome``
    says how it ended (the CLI exits with that outcome's code)."""

    exit_code = 1

    def __init__(self, message: str, outcome: Outcome) -> None:
        super().__init__(message)
        self.outcome = outcome


@dataclass
class EvalResult:
    """How an evaluation ended, and where it is recorded."""

    run_dir: Path | None
    summary: EvalSummary
    status: str
    """``completed``, ``failed``, ``interrupted`` or ``budget_exhausted``."""
    metadata: dict[str, Any]
    run_id: str | None = None
    """The registry run (``None`` without the registry)."""
    action: Action = "created"
    mlflow_run_id: str | None = None
    error: str | None = None
    """Why a failed run failed, and how to finish it."""

    def outcome(
        self,
        max_error_rate: float = DEFAULT_MAX_ERROR_RATE,
        max_tool_error_rate: float = DEFAULT_MAX_TOOL_ERROR_RATE,
    ) -> Outcome:
        """What happened, in one word: ``completed``, ``completed_with_errors`` (more
        than ``max_error_rate`` of the rollouts errored, or every one did, or more than
        ``max_tool_error_rate`` of the tool calls failed), ``interrupted`` or ``failed``."""
        if self.status != "completed":
            if self.status in ("interrupted", "budget_exhausted"):
                return self.status  # type: ignore[return-value]
            return "failed"
        too_many_tool_errors = self.summary.tool_error_rate > max_tool_error_rate
        if self._too_many_errors(max_error_rate) or too_many_tool_errors:
            return "completed_with_errors"
        return "completed"

    def _too_many_errors(self, max_error_rate: float) -> bool:
        errors, rollouts = self.summary.error_count, self.summary.rollouts
        return bool(errors) and (errors == rollouts or errors > max_error_rate * rollouts)

    def problem(
        self,
        max_error_rate: float = DEFAULT_MAX_ERROR_RATE,
        max_tool_error_rate: float = DEFAULT_MAX_TOOL_ERROR_RATE,
    ) -> str | None:
        """One line saying what went wrong and what to do; ``None`` when it completed."""
        outcome = self.outcome(max_error_rate, max_tool_error_rate)
        label = self.run_id or self.run_dir
        if outcome == "completed":
            return None
        if outcome == "completed_with_errors" and not self._too_many_errors(max_error_rate):
            return self._tool_problem(max_tool_error_rate)
        if outcome == "completed_with_errors":
            summary = self.summary
            kinds = ", ".join(f"{kind}: {n}" for kind, n in summary.errors.most_common(3))
            return (
                f"completed with errors: {summary.error_count} of {summary.rollouts} rollouts "
                f"errored ({kinds}); see each kind's message above, fix the endpoint or raise "
                "--max-retries and rerun, or accept a share of errors with --max-error-rate"
            )
        return self.error or f"eval run {label} ended {self.status}"

    def _tool_problem(self, max_tool_error_rate: float) -> str:
        summary = self.summary
        first = summary.first_tool_error_line
        first = f" (first: {first})" if first else ""
        return (
            f"completed with tool errors: {summary.tool_errors} of {summary.tool_calls} tool "
            f"calls failed{first}, above --max-tool-error-rate {max_tool_error_rate:g}; fix "
            "what the tools call (a tool server, its credentials) and rerun, or accept a "
            "higher share with --max-tool-error-rate"
        )

    def raise_for_status(self, max_error_rate: float | None = None) -> None:
        """Raise :class:`RunEnded` unless the run completed (and, when
        ``max_error_rate`` is given, unless its errors stay within it: by default a
        run with errored rollouts is a result, which :meth:`outcome` describes)."""
        if max_error_rate is None and self.status == "completed":
            return
        rate = DEFAULT_MAX_ERROR_RATE if max_error_rate is None else max_error_rate
        problem = self.problem(rate)
        if problem is not None:
            raise RunEnded(problem, self.outcome(rate))


@dataclass(frozen=True)
class OpenedRun:
    """What is known once a run is open (handed to :meth:`EvalProgress.opened`)."""

    run_id: str | None
    run_dir: Path
    action: Action
    planned: int
    """Rollouts the run will hold when complete."""
    done: int
    """Rollouts it already holds."""


class EvalProgress(Protocol):
    """Hooks for a progress display (the CLI's bar, a flow's log)."""

    def opened(self, run: OpenedRun) -> None: ...

    def group(self, records: list[RolloutRecord], summary: EvalSummary) -> None: ...
