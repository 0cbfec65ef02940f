"""What ``vfops`` exits with: one table from an evaluation's outcome to a process status.

The evaluation says how a run ended (:meth:`vfops.evaluation.EvalResult.outcome`);
mapping that onto exit statuses is a command line's convention (shells, CI, workers
and orchestrators read them), so it lives here, with the command line, and the
library stays usable where there is no process to exit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from vfops.costs import BUDGET_EXHAUSTED_EXIT_CODE

if TYPE_CHECKING:
    from vfops._errors import VfopsError
    from vfops.evaluation import EvalResult, Outcome

EXIT_CODES: Final[dict[Outcome, int]] = {
    "completed": 0,
    "failed": 1,
    # 2 is bad input (VfopsError), caught before a run is recorded
    "completed_with_errors": 3,  # or more tool calls failed than --max-tool-error-rate
    # 4: the run is busy (another process holds its lease or folder lock): RunBusyError;
    # or this process lost its lease to another that took the run over: LeaseLostError
    "interrupted": 130,  # 128 + SIGINT; SIGTERM exits 143 (the CLI knows which came)
    "budget_exhausted": BUDGET_EXHAUSTED_EXIT_CODE,  # a cost cap stopped it; resumable
}


def result_exit_code(result: EvalResult, max_error_rate: float, max_tool_error_rate: float) -> int:
    """The process exit status that says ``result.outcome(max_error_rate,
    max_tool_error_rate)`` (0 only when it completed). An interruption by a signal exits
    128 + the signal's number instead."""
    return EXIT_CODES[result.outcome(max_error_rate, max_tool_error_rate)]


def error_exit_code(exc: VfopsError) -> int:
    """The exit status of a user-facing error: a run that ended otherwise than completed
    (:class:`vfops.evaluation.RunEnded`) by its outcome, any other error by its own."""
    outcome = getattr(exc, "outcome", None)
    if outcome in EXIT_CODES:
        return EXIT_CODES[outcome]
    return exc.exit_code
