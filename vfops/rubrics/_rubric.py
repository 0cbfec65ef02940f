"""The rubric: weighted reward functions that score the rollouts of one example.

Reward functions name the arguments they want; the signature is inspected once,
when the function is added, because scoring is the eval's hot path (thousands
of rollouts a second) and ``inspect.signature`` per call costs more than most
reward functions.

Each call has a time limit (``scoring_timeout_s``); sync functions run in scoring
threads, off the event loop (see :mod:`vfops.rubrics._limits`), or, during an
evaluation, in scoring workers: processes with a memory limit that end what the
function starts (:mod:`vfops.rubrics._workers`).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any, ClassVar

from vfops._errors import VfopsError
from vfops._rollout import RolloutError, TokenUsage
from vfops._settings import scoring_timeout_s as default_scoring_timeout_s
from vfops._types import State
from vfops.costs import BudgetExhausted, scoring_rollout
from vfops.parsers import Parser
from vfops.rubrics._limits import SyncOutcome, limited, run_sync_calls
from vfops.rubrics._memory_guard import memory_error, scoring_in_process
from vfops.rubrics._score import RolloutScore
from vfops.rubrics._workers import ContainedCall, WorkerFailure, register_contained, run_contained

RewardFunc = Callable[..., Any]
"""A sync or async function returning a float (or, for group functions, a list)."""

# Per-rollout argument -> (state key, default when the state lacks it).
_ROLLOUT_ARGS: dict[str, tuple[str, Any]] = {
    "prompt": ("prompt", None),
    "completion": ("completion", None),
    "answer": ("answer", ""),
    "info": ("info", None),
    "task": ("task", "default"),
    "example_id": ("example_id", None),
    "rollout_index": ("rollout_index", None),
}
# Group argument -> the per-rollout argument it lists.
_GROUP_ARGS: dict[str, str] = {
    "prompts": "prompt",
    "completions": "completion",
    "answers": "answer",
    "states": "state",
    "infos": "info",
    "tasks": "task",
    "example_ids": "example_id",
}


@dataclass(slots=True)
class _RewardSpec:
    func: RewardFunc
    name: str
    weight: float
    is_async: bool
    is_group: bool
    params: tuple[str, ...]  # the injectable names the function declares
    all_kwargs: bool  # declares **kwargs: receives every per-rollout argument


_FAILED: Any = object()
"""A sync call's result when its error is already recorded."""


class _ScoringError(Exception):
    """A reward function's result is unusable (wrong type, length, NaN or infinite)."""


def _func_name(func: RewardFunc) -> str:
    name = getattr(func, "__name__", None)
    if isinstance(name, str):
        return name
    inner = getattr(func, "func", None)  # functools.partial
    if inner is not None:
        return _func_name(inner)
    return type(func).__name__


def _is_async(func: RewardFunc) -> bool:
    if inspect.iscoroutinefunction(func):
        return True
    call = getattr(func, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _as_float(value: Any, name: str) -> float:
    if type(value) is float:  # fast path: the common case
        result = value
    elif isinstance(value, Real):  # int, bool, numpy scalars
        result = float(value)
    else:
        raise _ScoringError(
            f"reward function {name!r} returned {type(value).__name__} {value!r:.80}, "
            "expected a number"
        )
    if not math.isfinite(result):
        # A NaN or infinite reward would silently poison every mean it enters (and
        # JSON has no Inf: the run folder would say null where the registry says Inf).
        raise _ScoringError(f"reward function {name!r} returned {result}, expected a finite number")
    return result


def _timeout_error(name: str, limit_s: float) -> RolloutError:
    return RolloutError(
        type="ScoringTimeout",
        message=f"reward function {name!r} did not return within {limit_s:g} s (the scoring "
        "timeout); make it faster, or raise the limit: Rubric(scoring_timeout_s=...) or "
        "VFOPS_SCORING_TIMEOUT_S (0: no limit)",
        stage="scoring",
    )


def _error(exc: BaseException, name: str) -> RolloutError:
    if isinstance(exc, WorkerFailure):  # in a scoring worker: raised, out of memory, died
        return exc.rollout_error(name)
    if isinstance(exc, _ScoringError):
        return RolloutError(type="InvalidReward", message=str(exc)[:2000], stage="scoring")
    if isinstance(exc, MemoryError):  # past the limit it scores under in this process
        return memory_error(name)
    message = f"reward function {name!r} raised {type(exc).__name__}: {exc}"
    return RolloutError(type=type(exc).__name__, message=message[:2000], stage="scoring")


class Rubric:
    """Weighted reward functions; ``reward`` is their weighted sum.

    A function receives only the keyword arguments it names among ``prompt,
    completion, answer, state, info, task, parser, example_id, rollout_index``
    (``**kwargs`` receives them all). A function naming plural arguments
    (``prompts, completions, answers, states, infos, tasks, example_ids``) is a
    group function: called once per group, it returns one float per rollout.
    Functions of weight 0 are metrics: recorded, not rewarded.

    Each call may take ``scoring_timeout_s`` seconds (default ``VFOPS_SCORING_TIMEOUT_S``,
    else 60; 0: no limit); one that takes longer leaves its rollout (every rollout of the
    group, for a group function) with ``reward=None`` and a ``ScoringTimeout`` error.
    Judge calls (:class:`JudgeRubric`) inside an async function do not count: they have
    their client's own timeout. Sync functions run in scoring threads, so that a slow one
    never blocks the event loop (nor Ctrl-C): the calls of one group one after another,
    those of different groups possibly at the same time.
    """

    # Names subclasses can inject besides the standard ones (JudgeRubric: "judge").
    _extra_arg_names: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        funcs: Sequence[RewardFunc] | None = None,
        weights: Sequence[float] | None = None,
        parser: Parser | None = None,
        *,
        scoring_timeout_s: float | None = None,
    ) -> None:
        self.parser: Parser = parser if parser is not None else Parser()
        if scoring_timeout_s is None:
            scoring_timeout_s = default_scoring_timeout_s()
        elif not (scoring_timeout_s >= 0):  # also NaN
            raise VfopsError(
                f"scoring_timeout_s must be a number of seconds >= 0 (0: no limit), "
                f"not {scoring_timeout_s!r}"
            )
        self.scoring_timeout_s: float = float(scoring_timeout_s)
        """Seconds one reward function call may take; 0 (or inf): no limit."""
        self._specs: list[_RewardSpec] = []
        self._serial = register_contained(self)  # how a scoring worker finds its copy
        funcs = list(funcs or [])
        if weights is None:
            weights = [1.0] * len(funcs)
        if len(weights) != len(funcs):
            raise VfopsError(
                f"Rubric got {len(funcs)} reward functions but {len(weights)} weights; "
                "pass one weight per function"
            )
        for func, weight in zip(funcs, weights, strict=True):
            self.add_reward_func(func, weight)

    # --- configuration -------------------------------------------------------------
    def add_reward_func(self, func: RewardFunc, weight: float = 1.0) -> None:
        """Add a reward function; its signature is checked here, once."""
        self._specs.append(self._make_spec(func, float(weight)))

    def add_metric(self, func: RewardFunc) -> None:
        """Add a function that is recorded in ``metrics`` but has weight 0."""
        self.add_reward_func(func, 0.0)

    @property
    def reward_func_names(self) -> list[str]:
        return [spec.name for spec in self._specs]

    @property
    def reward_weights(self) -> list[float]:
        return [spec.weight for spec in self._specs]

    @property
    def metric_names(self) -> list[str]:
        """The keys ``metrics`` can have (one per function)."""
        return self.reward_func_names

    def _extra_args(self) -> dict[str, Any]:
        """Values of ``_extra_arg_names`` (rubric-level, same for every rollout)."""
        return {}

    def _make_spec(self, func: RewardFunc, weight: float) -> _RewardSpec:
        if not callable(func):
            raise VfopsError(f"reward function {func!r} is not callable")
        name = _func_name(func)
        if name in self.reward_func_names:
            raise VfopsError(
                f"Rubric already has a reward function named {name!r}; metrics are keyed by "
                "name, so give the function a distinct __name__"
            )
        try:
            signature = inspect.signature(func)
        except (TypeError, ValueError) as exc:
            raise VfopsError(f"cannot inspect reward function {name!r}: {exc}") from exc
        shared = ("parser", *self._extra_arg_names)
        known = {*_ROLLOUT_ARGS, "state", *_GROUP_ARGS, *shared}
        params: list[str] = []
        all_kwargs = False
        for param in signature.parameters.values():
            if param.kind is param.VAR_KEYWORD:
                all_kwargs = True
            elif param.kind is param.VAR_POSITIONAL:
                continue
            elif param.name in known and param.kind is not param.POSITIONAL_ONLY:
                params.append(param.name)
            elif param.default is param.empty:
                raise VfopsError(
                    f"reward function {name!r} requires argument {param.name!r}, which vfops "
                    f"cannot supply; use keyword arguments among {sorted(known)}"
                )
        group = [p for p in params if p in _GROUP_ARGS]
        single = [p for p in params if p in _ROLLOUT_ARGS or p == "state"]
        if group and (single or all_kwargs):
            raise VfopsError(
                f"reward function {name!r} mixes group arguments {group} with per-rollout "
                f"arguments {single or ['**kwargs']}; use one kind"
            )
        return _RewardSpec(
            func=func,
            name=name,
            weight=weight,
            is_async=_is_async(func),
            is_group=bool(group),
            params=tuple(params),
            all_kwargs=all_kwargs,
        )

    # --- scoring ---------------------------------------------------------------------
    async def score_rollout(self, state: State) -> RolloutScore:
        """Score one rollout as a group of one."""
        return (await self.score_group([state]))[0]

    async def aclose(self) -> None:
        """Release resources (clients) the rubric holds; the environment calls this."""
        return None

    async def score_group(self, states: list[State]) -> list[RolloutScore]:
        """Score the rollouts of one example; one :class:`RolloutScore` per state, in order.

        Sync functions run one after another in a scoring thread while async ones are
        awaited concurrently. A function that raises, returns a non-number or runs past
        ``scoring_timeout_s`` leaves that rollout with ``reward=None`` and an ``error``
        naming it; the other functions still run and are recorded.
        """
        start = time.perf_counter()
        n = len(states)
        specs = self._specs
        limit = self._limit_s()
        # values[f][i]: function f's score for rollout i; errors[i]: first error of rollout i.
        values: list[list[float | None]] = [[None] * n for _ in specs]
        errors: list[list[RolloutError | None]] = [[None] * n for _ in specs]
        shared = {"parser": self.parser, **self._extra_args()}
        contexts = [self._context(state, shared) for state in states]
        group_context: dict[str, Any] | None = None
        pending: list[Awaitable[None]] = []
        # sync calls, and where each one's result goes: (f, rollout i, or None: the group)
        sync_calls: list[tuple[RewardFunc, dict[str, Any]]] = []
        sync_slots: list[tuple[int, int | None]] = []

        for f, spec in enumerate(specs):
            if spec.is_group:
                if group_context is None:
                    group_context = self._group_context(states, contexts, shared)
                kwargs = {p: group_context[p] for p in spec.params}
                if not spec.is_async:
                    sync_calls.append((spec.func, kwargs))
                    sync_slots.append((f, None))
                    continue
                try:
                    result = spec.func(**kwargs)
                except Exception as exc:
                    self._record_group_error(errors[f], _error(exc, spec.name))
                    continue
                if inspect.isawaitable(result):
                    pending.append(self._await_group(result, spec, values[f], errors[f], limit))
                else:
                    self._store_group(result, spec, values[f], errors[f])
                continue
            for i, context in enumerate(contexts):
                kwargs = dict(context) if spec.all_kwargs else {p: context[p] for p in spec.params}
                if not spec.is_async:
                    sync_calls.append((spec.func, kwargs))
                    sync_slots.append((f, i))
                    continue
                try:
                    result = spec.func(**kwargs)
                    if not inspect.isawaitable(result):
                        values[f][i] = _as_float(result, spec.name)
                        continue
                except Exception as exc:
                    errors[f][i] = _error(exc, spec.name)
                    continue
                pending.append(
                    self._await_one(
                        result, spec, values[f], errors[f], i, states[i].get("usage"), limit
                    )
                )

        if sync_calls:
            # one thread for the group's sync calls, while the async ones run here
            pending.append(self._run_sync(sync_calls, sync_slots, states, values, errors, limit))
        if pending:
            await asyncio.gather(*pending)

        elapsed_ms = (time.perf_counter() - start) * 1000.0
        scores: list[RolloutScore] = []
        for i in range(n):
            metrics: dict[str, float] = {}
            reward: float | None = 0.0
            first_error: RolloutError | None = None
            for f, spec in enumerate(specs):
                value = values[f][i]
                if value is None:
                    if first_error is None:
                        first_error = errors[f][i]
                    continue
                metrics[spec.name] = value
                if reward is not None and spec.weight:
                    reward += spec.weight * value
            if first_error is None and reward is not None and not math.isfinite(reward):
                # finite values whose weighted sum overflows: as unusable as an Inf
                first_error = RolloutError(
                    type="InvalidReward",
                    message=f"the weighted sum of the reward functions is {reward}",
                    stage="scoring",
                )
            if first_error is not None:
                reward = None
            # Wall-clock of the whole group: rollouts of a group are scored together.
            scores.append(RolloutScore(reward, metrics, first_error, elapsed_ms))
        return scores

    def _limit_s(self) -> float | None:
        limit = self.scoring_timeout_s
        return None if limit == 0 or math.isinf(limit) else limit

    async def _run_sync(
        self,
        calls: list[tuple[RewardFunc, dict[str, Any]]],
        slots: list[tuple[int, int | None]],
        states: list[State],
        values: list[list[float | None]],
        errors: list[list[RolloutError | None]],
        limit: float | None,
    ) -> None:
        outcomes = await self._contained(calls, slots, limit)
        if outcomes is None:
            with scoring_in_process():
                outcomes = await run_sync_calls(calls, limit)
        # a sync function may return an awaitable (a wrapper of an async one): awaited here
        later: list[Awaitable[None]] = []
        for (f, i), outcome in zip(slots, outcomes, strict=True):
            spec = self._specs[f]
            if i is None:
                result = self._sync_result(outcome, spec, errors[f], None, limit)
                if result is _FAILED:
                    continue
                if inspect.isawaitable(result):
                    later.append(self._await_group(result, spec, values[f], errors[f], limit))
                else:
                    self._store_group(result, spec, values[f], errors[f])
                continue
            result = self._sync_result(outcome, spec, errors[f], i, limit)
            if result is _FAILED:
                continue
            if inspect.isawaitable(result):
                usage = states[i].get("usage")
                later.append(self._await_one(result, spec, values[f], errors[f], i, usage, limit))
                continue
            try:
                values[f][i] = _as_float(result, spec.name)
            except Exception as exc:
                errors[f][i] = _error(exc, spec.name)
        if later:
            await asyncio.gather(*later)

    # --- in a scoring worker (vfops.rubrics._workers) ----------------------------------
    def contained_size(self) -> int:
        return len(self._specs)

    def contained_entry(self, index: int) -> tuple[Callable[..., Any], dict[str, Any]]:
        """Function ``index`` and the parser, a worker's copy (a call that takes the
        rubric's extra objects, e.g. a judge, is never sent)."""
        return self._specs[index].func, {"parser": self.parser}

    async def _contained(
        self,
        calls: list[tuple[RewardFunc, dict[str, Any]]],
        slots: list[tuple[int, int | None]],
        limit: float | None,
    ) -> list[SyncOutcome] | None:
        """The sync calls run by a scoring worker, when one holds this rubric; None:
        run them here (no workers, a function made later, an argument that is the
        rubric's own extra object, e.g. a judge bound to this event loop)."""
        shared_names = {"parser", *self._extra_arg_names}
        sent: list[ContainedCall] = []
        for (_, kwargs), (f, _) in zip(calls, slots, strict=True):
            shared = tuple(name for name in kwargs if name in shared_names)
            if any(name in self._extra_arg_names for name in shared):
                return None
            travelling = {k: v for k, v in kwargs.items() if k not in shared_names}
            sent.append((f, travelling, shared))
        answered = await run_contained(self._serial, self, sent, limit)
        if answered is None:
            return None
        inline = [k for k, outcome in enumerate(answered) if outcome is None]
        outcomes = [outcome or SyncOutcome() for outcome in answered]
        if inline:  # a sync wrapper of an async function: awaited in this process
            with scoring_in_process():
                redone = await run_sync_calls([calls[k] for k in inline], limit)
            for k, outcome in zip(inline, redone, strict=True):
                outcomes[k] = outcome
        return outcomes

    def _sync_result(
        self,
        outcome: SyncOutcome,
        spec: _RewardSpec,
        errors: list[RolloutError | None],
        i: int | None,
        limit: float | None,
    ) -> Any:
        """The value of a sync call, or ``_FAILED`` once its error is recorded (in slot
        ``i``, or every slot for a group function)."""
        error: RolloutError | None = None
        if outcome.timed_out:
            assert limit is not None
            error = _timeout_error(spec.name, limit)
        elif outcome.error is not None:
            if not isinstance(outcome.error, Exception):
                raise outcome.error  # SystemExit and the like stop the run, as inline
            error = _error(outcome.error, spec.name)
        if error is None:
            return outcome.value
        if i is None:
            self._record_group_error(errors, error)
        else:
            errors[i] = error
        return _FAILED

    @staticmethod
    def _context(state: State, shared: dict[str, Any]) -> dict[str, Any]:
        context = {arg: state.get(key, default) for arg, (key, default) in _ROLLOUT_ARGS.items()}
        if context["info"] is None:
            context["info"] = {}
        context["state"] = state
        context.update(shared)
        return context

    @staticmethod
    def _group_context(
        states: list[State], contexts: list[dict[str, Any]], shared: dict[str, Any]
    ) -> dict[str, Any]:
        group: dict[str, Any] = {
            plural: [c[single] for c in contexts] for plural, single in _GROUP_ARGS.items()
        }
        group.update(shared)
        return group

    @staticmethod
    def _record_group_error(errors: list[RolloutError | None], error: RolloutError) -> None:
        for i in range(len(errors)):
            errors[i] = error

    def _store_group(
        self,
        result: Any,
        spec: _RewardSpec,
        values: list[float | None],
        errors: list[RolloutError | None],
    ) -> None:
        try:
            if isinstance(result, (str, bytes)) or not hasattr(result, "__len__"):
                raise _ScoringError(
                    f"group reward function {spec.name!r} returned {type(result).__name__}, "
                    "expected a list with one float per rollout"
                )
            if len(result) != len(values):
                raise _ScoringError(
                    f"group reward function {spec.name!r} returned {len(result)} values "
                    f"for a group of {len(values)} rollouts"
                )
            floats = [_as_float(v, spec.name) for v in result]
        except Exception as exc:
            self._record_group_error(errors, _error(exc, spec.name))
            return
        values[:] = floats

    async def _await_group(
        self,
        awaitable: Awaitable[Any],
        spec: _RewardSpec,
        values: list[float | None],
        errors: list[RolloutError | None],
        limit: float | None,
    ) -> None:
        try:
            # what scores in this process does so under a memory limit: a blow-up is its
            # rollout's error, not the eval's OOM kill (_memory_guard)
            async with limited(limit) as timeout:
                with scoring_in_process():
                    result = await awaitable
        except Exception as exc:
            if limit is not None and timeout.expired():
                self._record_group_error(errors, _timeout_error(spec.name, limit))
            else:
                self._record_group_error(errors, _error(exc, spec.name))
            return
        if limit is not None and timeout.expired():  # it swallowed the cancellation: late
            self._record_group_error(errors, _timeout_error(spec.name, limit))
            return
        self._store_group(result, spec, values, errors)

    @staticmethod
    async def _await_one(
        awaitable: Awaitable[Any],
        spec: _RewardSpec,
        values: list[float | None],
        errors: list[RolloutError | None],
        i: int,
        usage: TokenUsage | None,
        limit: float | None,
    ) -> None:
        # this task's judge calls are charged to rollout i (the coroutine runs here)
        scoring_rollout(usage)
        try:
            async with limited(limit) as timeout:
                with scoring_in_process():
                    result = await awaitable
            if limit is not None and timeout.expired():  # it swallowed the cancellation
                errors[i] = _timeout_error(spec.name, limit)
                return
            values[i] = _as_float(result, spec.name)
        except BudgetExhausted:  # a judge call had no room under the cap: the run stops
            raise
        except Exception as exc:
            if limit is not None and timeout.expired():
                errors[i] = _timeout_error(spec.name, limit)
            else:
                errors[i] = _error(exc, spec.name)
