"""The rewards and metrics of a ``verifiers`` v1 taskset, run in vfops's scoring
workers (:mod:`vfops.rubrics._workers`): a reward that allocates 10 GB errors its
rollout instead of getting the eval OOM-killed, and what it starts ends with it.

A v1 ``Task`` scores a trace by calling the functions its ``hooks("reward")`` and
``hooks("metric")`` return (its ``@vf.reward``/``@vf.metric`` methods and the functions
its config plugs in), each an ``async`` function given what it names of ``task``,
``trace`` and ``runtime``. :func:`contain_task_class` makes a task class's ``hooks``
return, for those two, functions with the same name, signature and weight that send
the call (the task and the arguments, pickled) to a scoring worker, which runs it to
the end on an event loop of its own. What comes back is what the function returned or
raised (an exception of the same name and text: ``verifiers`` makes it the trace's
scoring error, as it would have); a call stopped by the worker's memory limit, or
whose worker died, raises ``ScoringMemoryLimit`` / ``ScoringWorkerDied`` the same way,
so the rollout is a scoring error, never a score.

Runs in the eval's process, as ``verifiers`` runs it: a call when no worker of the
running evaluation exists (outside an eval, ``VFOPS_SCORING_WORKERS=0``, threads
running), and one whose arguments cannot be pickled (a ``runtime``: a sandbox's
handle). What a function changes on the task or the trace stays in its worker.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from typing import Any, Final

from vfops.rubrics import (
    ContainedCall,
    WorkerFailure,
    memory_error,
    register_contained,
    run_contained,
    scoring_in_process,
)

__all__ = ["ContainedTaskHooks", "contain_task_class"]

_CONTAINED: Final = ("reward", "metric")
_MARK: Final = "_vfops_contained_hooks"


class ContainedTaskHooks:
    """What a scoring worker (a copy of this process) runs: a task's hook by name, or a
    plugged function, with the arguments that travelled."""

    def __init__(self) -> None:
        self.serial = register_contained(self)

    def contained_size(self) -> int:
        return 1  # one entry: the call itself names its function

    def contained_entry(self, index: int) -> tuple[Callable[..., Any], dict[str, Any]]:
        return run_hook, {}


def run_hook(target: Any, arguments: dict[str, Any]) -> Any:
    """In a scoring worker: a task's hook (``(task, name)``) or a plugged function, run
    to its end on an event loop of its own (the worker runs none)."""
    if isinstance(target, tuple):
        task, name = target
        target = getattr(task, name)
    return asyncio.run(target(**arguments))


_HOOKS: Final = ContainedTaskHooks()
"""Registered on import (with the taskset's load, before an eval forks its workers)."""


def contain_task_class(cls: type, hooks: ContainedTaskHooks = _HOOKS) -> None:
    """Make ``cls.hooks`` send its rewards and metrics to scoring workers (once per
    class: a subclass's tasks are contained when the subclass is seen)."""
    if _MARK in vars(cls):
        return
    original = cls.hooks  # type: ignore[attr-defined]

    def contained_hooks(self: Any, attr: str) -> list[Callable[..., Any]]:
        found = original(self, attr)
        if attr not in _CONTAINED:
            return list(found)
        return [_contained(self, fn, hooks) for fn in found]

    contained_hooks.__doc__ = original.__doc__
    cls.hooks = contained_hooks  # type: ignore[attr-defined]
    setattr(cls, _MARK, True)


def _contained(task: Any, fn: Callable[..., Any], hooks: ContainedTaskHooks) -> Callable[..., Any]:
    """``fn`` with its name, signature and marks (weight, priority), run in a worker."""
    if not inspect.iscoroutinefunction(fn):
        return fn  # verifiers awaits what it calls: not ours to change
    name = getattr(fn, "__name__", "")
    bound = getattr(fn, "__self__", None) is task and getattr(task, name, None) == fn
    target: Any = (task, name) if bound else fn

    @functools.wraps(fn)
    async def contained(**arguments: Any) -> Any:
        call: ContainedCall = (0, {"target": target, "arguments": arguments}, ())
        outcomes = await run_contained(hooks.serial, hooks, [call], None)
        if outcomes is None or outcomes[0] is None:
            try:
                with scoring_in_process():  # here, under this process's scoring limit
                    return await fn(**arguments)
            except MemoryError:
                failure = memory_error(name)
                raise type(failure.type, (Exception,), {})(failure.message) from None
        outcome = outcomes[0]
        if outcome.error is None:
            return outcome.value
        error = outcome.error
        if isinstance(error, WorkerFailure):
            detail = error.rollout_error(name).message if error.contained else error.detail
            # the same name and text as in-process: verifiers' scoring error reads them
            raise type(error.kind, (Exception,), {})(detail)
        raise error

    return contained
