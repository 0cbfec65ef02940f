"""Which run and which rollout the current code works for, as context variables.

The evaluation sets the run (:func:`run_scope`) around its rollouts and each rollout's
task sets its own key (:func:`rollout_scope`); whatever a rollout starts that outlives
a function call (a sandbox container, above all) reads them to label what it made, so
that what a dead run left can be found and removed by run and rollout. Context
variables, not arguments: an environment's own code starts those things, and it is
never handed the run's id.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["RolloutScope", "current_scope", "rollout_scope", "run_scope"]


@dataclass(frozen=True)
class RolloutScope:
    """The run (its registry id or folder name) and the rollout (``example:index``)."""

    run: str | None = None
    rollout: str | None = None


_RUN: ContextVar[str | None] = ContextVar("vfops_run", default=None)
_ROLLOUT: ContextVar[str | None] = ContextVar("vfops_rollout", default=None)


@contextlib.contextmanager
def run_scope(run: str | None) -> Iterator[None]:
    token = _RUN.set(run)
    try:
        yield
    finally:
        _RUN.reset(token)


@contextlib.contextmanager
def rollout_scope(example_id: int, rollout_index: int) -> Iterator[None]:
    token = _ROLLOUT.set(f"{example_id}:{rollout_index}")
    try:
        yield
    finally:
        _ROLLOUT.reset(token)


def current_scope() -> RolloutScope:
    return RolloutScope(run=_RUN.get(), rollout=_ROLLOUT.get())
