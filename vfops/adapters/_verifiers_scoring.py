"""The sync reward functions of a classic ``verifiers`` environment, run in vfops's
scoring workers (:mod:`vfops.rubrics._workers`): a reward that allocates 10 GB errors
its rollout instead of getting the eval OOM-killed, and what it starts ends with it.

``verifiers`` 0.3 calls each reward function through two methods of its ``Rubric``
(``_call_individual_reward_func``, ``_call_group_reward_func``): they pick the
function's arguments from the rubric's score objects and turn anything it raises into
0.0 (logged). :func:`contain_rewards` replaces those two methods on every rubric of an
environment (a ``RubricGroup``'s members, an ``EnvGroup``'s environments) with ones
that pick the same arguments, send a sync function's call to a scoring worker, and
give back what ``verifiers`` would have: the value, or 0.0 and the same log line when
the function raised. Only what containment itself stopped differs: a call past the
worker's memory limit, or whose worker died, is that rollout's scoring error (every
rollout's of a group function) and never a score, where in-process it would have taken
the eval down.

Runs in the eval's process, as ``verifiers`` runs it: async functions (a judge's
client is bound to the eval's loop), calls when no worker holds the rubric (no
workers, a function added after the eval started) and calls whose arguments cannot be
pickled. A ``state`` travels without its entries that cannot be pickled (the client,
the usage tracker), and a function's writes to it stay in its worker.
"""

from __future__ import annotations

import functools
import inspect
import math
import pickle
from collections.abc import Callable, Iterator
from typing import Any

from vfops._rollout import RolloutError
from vfops.rubrics import (
    ContainedCall,
    WorkerFailure,
    memory_error,
    register_contained,
    run_contained,
    scoring_in_process,
)

__all__ = ["SCORING_ERROR_KEY", "ContainedRewards", "contain_rewards", "contained_error"]

SCORING_ERROR_KEY = "vfops_scoring_error"
"""Where a rollout's containment failure is left in its ``verifiers`` state (the
adapter makes it the rollout's scoring error)."""

_INDIVIDUAL = "_call_individual_reward_func"
_GROUP = "_call_group_reward_func"


def contain_rewards(vf_env: Any) -> ContainedRewards | None:
    """Route the sync reward functions of ``vf_env``'s rubrics through scoring workers
    (from the next evaluation that starts them on); None when it has none."""
    rubrics = list(dict.fromkeys(_rubrics(vf_env)))  # one entry per rubric, in order
    contained = ContainedRewards(rubrics)
    return contained if contained.contained_size() else None


def _rubrics(vf_env: Any) -> Iterator[Any]:
    """Every rubric that scores ``vf_env``'s groups: an ``EnvGroup``'s environments'
    rubrics and a ``RubricGroup``'s members (whose ``score_group`` calls theirs)."""
    for env in [vf_env, *getattr(vf_env, "envs", [])]:
        if env is not vf_env:
            yield from _rubrics(env)
            continue
        pending = [getattr(env, "rubric", None)]
        while pending:
            rubric = pending.pop(0)
            if rubric is None:
                continue
            if hasattr(rubric, _INDIVIDUAL) and hasattr(rubric, "funcs"):
                yield rubric
            pending.extend(getattr(rubric, "rubrics", []))


class ContainedRewards:
    """The sync reward functions of some ``verifiers`` rubrics, by index, as a scoring
    worker (a copy of this process) finds and calls them."""

    def __init__(self, rubrics: list[Any]) -> None:
        self._funcs: list[tuple[Any, Callable[..., Any]]] = []
        self._index: dict[tuple[int, int], int] = {}
        self._signatures: list[inspect.Signature] = []
        for rubric in rubrics:
            for func in rubric.funcs:
                if inspect.iscoroutinefunction(func) or (id(rubric), id(func)) in self._index:
                    continue
                self._index[(id(rubric), id(func))] = len(self._funcs)
                self._funcs.append((rubric, func))
                self._signatures.append(inspect.signature(func))
        # the state entries that cannot travel (the client, the usage tracker), by name
        self._checked: set[str] = set()
        self._dropped: set[str] = set()
        if not self._funcs:
            return
        self._serial = register_contained(self)
        for rubric in rubrics:
            self._wrap(rubric)

    # --- in a scoring worker -------------------------------------------------------
    def contained_size(self) -> int:
        return len(self._funcs)

    def contained_entry(self, index: int) -> tuple[Callable[..., Any], dict[str, Any]]:
        """Function ``index`` and the class objects (the parser) it may take: every one
        to a function taking ``**kwargs``, else those it names."""
        rubric, func = self._funcs[index]
        return func, self._arguments(index, rubric.class_objects)

    # --- in the eval's process -------------------------------------------------------
    def _wrap(self, rubric: Any) -> None:
        individual, group = getattr(rubric, _INDIVIDUAL), getattr(rubric, _GROUP)

        async def call_individual(func: Any, state: Any) -> float:
            outcome = await self._run(rubric, func, lambda: rubric.score_objects(state))
            if outcome is None:
                watched = _Watched(func)
                with scoring_in_process():
                    value = float(await individual(watched.func, state))
                if watched.out_of_memory:  # verifiers made it 0.0: the rollout's error
                    state[SCORING_ERROR_KEY] = memory_error(_name(func))
                    return math.nan
                return value
            value, failure = outcome
            if failure is not None:
                state[SCORING_ERROR_KEY] = failure.rollout_error(_name(func))
                return math.nan  # never a score: the rollout is an error
            try:
                if isinstance(value, WorkerFailure):
                    raise value
                return float(value)
            except Exception as exc:  # as verifiers does: logged, 0.0
                rubric.logger.error(f"Error calling reward function {_name(func)}: {exc}")
                return 0.0

        async def call_group(func: Any, states: list[Any]) -> list[float]:
            outcome = await self._run(rubric, func, lambda: rubric.group_score_objects(states))
            if outcome is None:
                watched = _Watched(func)
                with scoring_in_process():
                    values = list(await group(watched.func, states))
                if watched.out_of_memory:
                    for state in states:
                        state[SCORING_ERROR_KEY] = memory_error(_name(func))
                    return [math.nan] * len(states)
                return values
            value, failure = outcome
            if failure is not None:
                for state in states:
                    state[SCORING_ERROR_KEY] = failure.rollout_error(_name(func))
                return [math.nan] * len(states)
            if isinstance(value, WorkerFailure):  # as verifiers does: logged, 0.0 each
                rubric.logger.error(f"Error calling group reward function {_name(func)}: {value}")
                return [0.0] * len(states)
            return value  # type: ignore[no-any-return]  # unchanged, as verifiers returns it

        setattr(rubric, _INDIVIDUAL, call_individual)
        setattr(rubric, _GROUP, call_group)

    def _arguments(self, index: int, objects: dict[str, Any]) -> dict[str, Any]:
        """The arguments ``verifiers`` passes: every score object to a function that
        takes ``**kwargs``, else those it names."""
        parameters = self._signatures[index].parameters
        if any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
            return dict(objects)
        return {k: v for k, v in objects.items() if k in parameters}

    async def _run(
        self, rubric: Any, func: Any, objects: Callable[[], dict[str, Any]]
    ) -> tuple[Any, WorkerFailure | None] | None:
        """(value or the function's own error, containment failure) from a worker, given
        the rubric's score objects; None: call it in this process (as verifiers does)."""
        index = self._index.get((id(rubric), id(func)))
        if index is None:
            return None
        kwargs = self._arguments(index, objects())
        shared = tuple(name for name in kwargs if name in rubric.class_objects)
        travelling = {k: self._portable(k, v) for k, v in kwargs.items() if k not in shared}
        call: ContainedCall = (index, travelling, shared)
        outcomes = await run_contained(self._serial, self, [call], None)
        if outcomes is None or outcomes[0] is None:
            return None
        outcome = outcomes[0]
        error = outcome.error
        if isinstance(error, WorkerFailure) and error.contained:
            return None, error
        # a worker's error is always a WorkerFailure (answer_outcome); no time limit here
        return (error if error is not None else outcome.value), None

    def _portable(self, name: str, value: Any) -> Any:
        if name == "state":
            return self._portable_state(value)
        if name == "states":
            return [self._portable_state(state) for state in value]
        return value

    def _portable_state(self, state: Any) -> Any:
        """A copy of ``state`` (its own class) without the entries that cannot be
        pickled; which those are is learnt once per entry name."""
        for key in state.keys() - self._checked:
            self._checked.add(key)
            try:
                pickle.dumps(dict.__getitem__(state, key), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:
                self._dropped.add(key)
        copy = type(state)()
        dict.update(copy, ((k, v) for k, v in dict.items(state) if k not in self._dropped))
        return copy


class _Watched:
    """``func`` as ``verifiers`` sees it (same name and signature), noting whether it
    ran out of memory under this process's scoring limit (``verifiers`` turns any
    exception into 0.0: that one must be the rollout's error instead)."""

    def __init__(self, func: Any) -> None:
        self.out_of_memory = False

        @functools.wraps(func)
        async def watched(*args: Any, **kwargs: Any) -> Any:
            try:
                result = func(*args, **kwargs)
                return (await result) if inspect.isawaitable(result) else result
            except MemoryError:
                self.out_of_memory = True
                raise

        self.func = watched


def _name(func: Any) -> str:
    return str(getattr(func, "__name__", repr(func)))


def contained_error(vf_state: Any) -> RolloutError | None:
    """The containment failure left in a rollout's state, if any."""
    error = vf_state.get(SCORING_ERROR_KEY)
    return error if isinstance(error, RolloutError) else None
