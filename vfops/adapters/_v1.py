"""Tasksets written for today's ``verifiers`` (0.4 on: ``import verifiers.v1 as vf``) run
by vfops: evaluated, swept, gated, published and trained on like its own environments.

``verifiers``' own objects run as ``verifiers`` runs them: the taskset's ``load()`` and
its ``TasksetConfig``/``TaskConfig`` (validated by ``verifiers``' config classes, so a
wrong ``-a`` field is refused naming it), its ``Env`` (``SingleAgentEnv``, or the
taskset's own, e.g. a scripted user replaying turns through an ``interaction``), each
episode's ``Agent`` and ``Rollout`` (setup, ``@stop`` hooks, limits, interceptors,
finalize, ``@reward``/``@metric`` scoring with weights, judges) and its ``Trace``. What vfops
supplies: the harness (``null``'s chat loop in this process,
:mod:`vfops.adapters._v1_harness`), the model calls (through a vfops client:
:mod:`vfops.adapters._v1_transport`) and everything around an episode — the rows it
records, the registry, MLflow, sweeps and training.

Every kind of ``Env`` runs: a plain taskset's one agent, a multi-agent ``Env`` (two seats
playing each other through interactions) and a role run more than once per episode
(siblings compared in ``finalize``). Each trace of such an episode is one vfops rollout
carrying its ``episode`` and ``agent`` (``rollout_index`` = episode x
:data:`~vfops._rollout.EPISODE_TRACE_SLOTS` + its place in the episode). An infinite taskset
runs its first N tasks (``-n N``, as ``vf-eval`` takes them). Toolsets run as
``verifiers`` runs them, their MCP servers as local subprocesses; a taskset's shared tool
servers get the key of each rollout's state channel, as ``Env.serving()`` gives it.

Not run (refused in one line before any request): a task that needs a container
(``NEEDS_CONTAINER``, an ``image``) and a taskset that ships its own harness.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

from vfops._errors import InvalidArgumentError, MissingExtraError, VfopsError
from vfops._rollout import (
    EPISODE_TRACE_SLOTS,
    ErrorStage,
    RolloutError,
    StopReason,
    TokenUsage,
    episode_of,
)
from vfops._rollout_scope import rollout_scope
from vfops._tool_counts import FIRST_TOOL_ERROR, TOOL_CALLS, TOOL_ERRORS
from vfops._types import Messages, SamplingArgs, State
from vfops.adapters._group import GroupEnvironment
from vfops.adapters._v1_scoring import contain_task_class
from vfops.adapters._verifiers_line import installed_line
from vfops.clients import ModelClient
from vfops.envs import Example
from vfops.rubrics import RolloutScore

SUPPORTED_VERIFIERS_V1 = ">=0.4.0,<0.5"


def _import_v1() -> Any:
    if installed_line() != "v1":
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("verifiers")
        except PackageNotFoundError:
            raise MissingExtraError("verifiers-v1", "verifiers") from None
        raise VfopsError(
            f"verifiers {found} is installed; v1 tasksets need verifiers "
            f"{SUPPORTED_VERIFIERS_V1}: pip install 'vfops[verifiers-v1]' (its own virtualenv)"
        )
    from vfops.adapters import _v1_speedups

    _v1_speedups.before_import()
    import verifiers.v1 as vf

    # verifiers' import leaves ~360,000 objects (the openai, anthropic and sympy types it
    # loads) that live as long as the process; every full collection of the cyclic GC
    # would walk them again: frozen, the rollout loop took 3.3 s of CPU instead of 4.3 s
    # for 2,000 rollouts (bench/README.md)
    gc.freeze()

    from vfops.adapters import _v1_harness

    _v1_harness.install()
    _v1_speedups.install()
    return vf


def load_taskset_environment(module: str, name: str, /, **args: Any) -> TasksetEnvironment:
    """The v1 taskset of ``module`` (its ``__all__``'s ``Taskset``) with its config fields
    set from ``args`` (``{"task": {...}}`` for its ``TaskConfig``), as a vfops environment."""
    vf = _import_v1()
    from vfops.adapters._v1_config import env_config

    def build(runtime: str) -> tuple[Any, list[str]]:
        config, notes = env_config(vf, module, name, args, runtime)
        try:
            return vf.load_environment(config), notes
        except VfopsError:
            raise
        except Exception as exc:
            raise VfopsError(
                f"taskset '{name}' could not be built: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}"
            ) from exc

    env, notes = build("subprocess")
    return TasksetEnvironment(env, name=name, notes=notes, rebuild=build)


class TasksetEnvironment(GroupEnvironment):
    """A ``verifiers`` v1 ``Env`` (its taskset inside) seen as a vfops :class:`Environment`.

    Rows are the taskset's tasks (``example_id`` is the task's ``idx``; ``info`` keeps its
    ``key`` and ``hash``, the task data's identity, and the data's own fields). A rollout
    is one episode of ``verifiers``' ``Env.run_episode`` on that task; its trace becomes
    the vfops state: messages, per-function rewards and metrics, stop condition, errors,
    usage and cost of its model calls, timing.
    """

    library = "verifiers-v1"

    def __init__(
        self,
        vf_env: Any,
        *,
        name: str,
        notes: Sequence[str] = (),
        rebuild: Callable[[str], tuple[Any, list[str]]] | None = None,
    ) -> None:
        from verifiers.v1.envs.single_agent import SingleAgentEnv

        self.vf_env = vf_env
        self._rebuild = rebuild
        """Builds the ``Env`` again on a container runtime (``podman``, ``docker``) when its
        tasks need one (known once its tasks are loaded)."""
        self._tasks: dict[int, Any] = {}
        self._built: list[dict[str, Any]] | None = None
        self._limit: int | None = None
        self._serving: _Serving | None = None
        self._notes = list(notes)
        self.multi_trace = type(vf_env).run is not SingleAgentEnv.run
        """Whether an episode may produce several traces (an ``Env`` with a ``run`` of its
        own: several agents, a role run twice, a user replaying turns): its traces'
        rollout indices are then episode x EPISODE_TRACE_SLOTS + position."""
        # a taskset has no splits (its config may select one): the trainer's split and
        # the held-out one are the taskset as configured
        super().__init__(dataset=self._rows, eval_dataset=self._rows, name=name)

    def _rows(self) -> list[dict[str, Any]]:
        if self._built is None:
            self._built = self._load_rows()
        return self._built

    def notices(self) -> list[str]:
        return list(self._notes)

    @property
    def infinite(self) -> bool:
        return not self.vf_env.taskset.bounded

    def eval_size(self, wanted: int = -1) -> int | None:
        if not self.infinite:
            return super().eval_size(wanted)
        if wanted < 0:
            raise InvalidArgumentError(
                f"taskset '{self.name}' is infinite ({type(self.vf_env.taskset).__name__}"
                ".INFINITE); say how many of its tasks to run, its first N as verifiers' "
                "eval takes them: vfops eval -n N (num_examples in a sweep or nightly spec)"
            )
        if self._limit is None or wanted > self._limit:
            # the first `wanted` tasks; the splits built from fewer are built again
            self._limit, self._built = wanted, None
            self._formatted.clear()
            self._converted.clear()
        return wanted

    def episode_of(self, rollout_index: int) -> int:
        return episode_of(rollout_index, multi_trace=self.multi_trace)

    def _load_rows(self) -> list[dict[str, Any]]:
        import itertools

        from vfops.adapters._v1_containers import (
            container_engine,
            install_labelled_runtimes,
            needs_container,
            place_in_container,
        )
        from vfops.adapters._v1_support import check_supported, task_row

        taskset = self.vf_env.taskset
        if self.infinite and self._limit is None:
            self.eval_size()  # refuses: an infinite taskset runs with a number of tasks
        tasks = list(itertools.islice(taskset, self._limit if self.infinite else None))
        if any(map(needs_container, tasks)) and self._rebuild is not None:
            # verifiers' own podman/docker runtime for every role, as vf-eval would run it
            where = f"taskset '{self.name}'"
            self.vf_env, _ = self._rebuild(container_engine(where))
            self._rebuild = None
            install_labelled_runtimes()
            return self._load_rows()
        rows = []
        for task in tasks:
            check_supported(self.name, task)
            container = None
            if needs_container(task):
                where = f"task {task.data.idx} of taskset '{self.name}'"
                container = place_in_container(task, where)
            contain_task_class(type(task))  # its rewards and metrics: in scoring workers
            self._tasks[int(task.data.idx)] = task
            row = task_row(task)
            if container is not None:
                row["info"]["container"] = container
            rows.append(row)
        return rows

    async def aclose(self) -> None:
        serving, self._serving = self._serving, None
        if serving is not None:
            await serving.close()

    async def run_group_states(
        self,
        client: ModelClient,
        model: str,
        example: Example,
        rollout_indices: Sequence[int],
        *,
        sampling_args: SamplingArgs | None = None,
        limiter: asyncio.Semaphore | None = None,
    ) -> tuple[list[State], list[RolloutScore]]:
        task = self._task_for(example)
        serving = await self._serve()
        ctx = serving.context(client, model, self.merged_sampling_args(sampling_args))

        async def one(index: int) -> list[tuple[State, RolloutScore]]:
            # a container the episode starts is labelled with its rollout
            with rollout_scope(example.example_id, index):
                async with limiter or contextlib.nullcontext():
                    return await serving.episode(task, ctx, example, index, self.multi_trace)

        episodes = await asyncio.gather(*map(one, rollout_indices))
        done = [pair for pairs in episodes for pair in pairs]
        return [state for state, _ in done], [score for _, score in done]

    def _task_for(self, example: Example) -> Any:
        if not self._tasks:
            self._rows()
        task = self._tasks.get(example.example_id)
        if task is None:
            raise VfopsError(
                f"taskset '{self.name}' has no task with idx {example.example_id}; "
                "rows of a v1 taskset come from its load()"
            )
        return task

    async def _serve(self) -> _Serving:
        loop = asyncio.get_running_loop()
        if self._serving is not None and self._serving.loop is not loop:
            self._serving = None  # a previous event loop's (a trainer's earlier step)
        if self._serving is None:
            self._serving = _Serving(self.vf_env, loop)
        await self._serving.started()
        return self._serving


class _Serving:
    """The env-level resources of ``Env.serving()`` (shared tool servers, the interception)
    held by a task of their own, so that they are entered and left in one task (MCP's
    AnyIO scopes require it) while rollouts run in others."""

    def __init__(self, vf_env: Any, loop: asyncio.AbstractEventLoop) -> None:
        from vfops.adapters._v1_transport import ClientDirectory

        self.vf_env = vf_env
        self.loop = loop
        self.directory = ClientDirectory()
        self._up = asyncio.Event()
        self._down = asyncio.Event()
        self._failure: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    async def started(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._hold())
        await self._up.wait()
        if self._failure is not None:
            raise VfopsError(
                f"taskset '{self.vf_env.config.env_id}' could not start its servers: "
                f"{type(self._failure).__name__}: {self._failure}"
            ) from self._failure

    async def _hold(self) -> None:
        from vfops.adapters._v1_transport import InProcessInterception

        env = self.vf_env
        try:
            async with env.shared_tools() as shared:
                secrets = tuple(s.state_secret for s in shared.values() if s.state_secret)
                async with InProcessInterception(self.directory, secrets) as interception:
                    await self._serve_with(env, shared, interception)
        except Exception as exc:
            self._failure = exc
        finally:
            self._up.set()

    async def _serve_with(self, env: Any, shared: Any, interception: Any) -> None:
        """Env.serving()'s body: the env's agents borrow these until the run is over."""
        from vfops.adapters._v1_transport import register, unregister

        register(interception)
        env._shared_tools, env._interception = shared, interception
        try:
            await env.start()
            self._up.set()
            await self._down.wait()
        finally:
            try:
                await env.stop()
            finally:
                env._shared_tools, env._interception = {}, None
                unregister(interception)

    async def close(self) -> None:
        self._down.set()
        if self._task is not None:
            await self._task

    def context(self, client: ModelClient, model: str, sampling: SamplingArgs) -> Any:
        from verifiers.v1.clients import ModelContext
        from verifiers.v1.types import SamplingConfig

        return ModelContext(
            model=model,
            client=self.directory.config_for(client),
            sampling=SamplingConfig.model_validate(dict(sampling)),
        )

    async def episode(
        self, task: Any, ctx: Any, example: Example, index: int, multi_trace: bool
    ) -> list[tuple[State, RolloutScore]]:
        """One episode of ``task``: a state and score per trace (one unless
        ``multi_trace``), or one failed state when it produced none."""
        from vfops.adapters._v1_transport import ledger

        started = time.perf_counter()
        with ledger() as found:
            episode = await self.vf_env.run_episode(task, ctx)
        if found.stopped_by is not None:
            raise found.stopped_by
        if not episode.traces:
            failed = RolloutError(
                type="EnvError", message=_first_error(episode), stage="environment"
            )
            slot = index * EPISODE_TRACE_SLOTS if multi_trace else index
            state = _failed_state(example, slot, failed, started)
            if multi_trace:
                state["episode"] = index
            return [(state, RolloutScore(reward=None))]
        every = [r for calls in found.responses.values() for r in calls]
        if not multi_trace:
            trace = episode.traces[-1]
            return [trace_state(episode, trace, example, index, every, found, started)]
        if len(episode.traces) > EPISODE_TRACE_SLOTS:
            raise VfopsError(
                f"an episode of taskset '{self.vf_env.config.env_id}' produced "
                f"{len(episode.traces)} traces; vfops records at most {EPISODE_TRACE_SLOTS}"
            )
        pairs = []
        for position, trace in enumerate(episode.traces):
            slot = index * EPISODE_TRACE_SLOTS + position
            # each trace its own model calls (the interception keys them by trace id)
            own = found.responses.get(trace.id, [])
            state, score = trace_state(episode, trace, example, slot, own, found, started)
            state["episode"], state["agent"] = index, str(trace.agent.name)
            pairs.append((state, score))
        return pairs


def trace_state(
    episode: Any,
    trace: Any,
    example: Example,
    index: int,
    responses: list[Any],
    found: Any,
    started: float,
) -> tuple[State, RolloutScore]:
    """One trace of an episode as a vfops state and score: ``responses`` are its model
    calls, ``found`` the episode's :class:`~vfops.adapters._v1_transport.RolloutLedger`."""
    prompt, completion = split_messages(trace)
    usage = TokenUsage()
    for response in responses:
        usage.add(response.prompt_tokens, response.completion_tokens, response.cached_tokens)
        usage.add_cost(response.cost_usd)
    error = trace_error(trace, episode)
    tools = found.tools.get(trace.id)
    state: State = {
        "example_id": example.example_id,
        "rollout_index": index,
        "prompt": prompt or example.prompt,
        "completion": completion,
        "answer": example.answer,
        # verifiers' own stop condition (a task's @stop by name, a limit...): vfops's
        # stop_reason says only which kind it was
        "info": {**example.info, "stop_condition": trace.stop_condition},
        "task": example.task,
        "turn": trace.num_turns,
        "responses": responses,
        "usage": usage,
        "stop_reason": stop_reason(trace, error),
        "error": error,
        "generation_ms": _span_ms(trace.timing.agent) or (time.perf_counter() - started) * 1000,
        # a trace of a seat the Env does not train (a judge, a simulated user)
        "trainable": bool(trace.agent.trainable),
    }
    if tools is not None and tools.calls:
        state[TOOL_CALLS], state[TOOL_ERRORS] = tools.calls, tools.errors
        state[FIRST_TOOL_ERROR] = tools.first_error
    metrics = {name: float(r.score) for name, r in trace.rewards.items() if r is not None}
    metrics.update((name, float(v)) for name, v in trace.metrics.items() if v is not None)
    reward = float(trace.reward) if error is None else None
    scoring_ms = _span_ms(trace.timing.scoring)
    return state, RolloutScore(reward=reward, metrics=metrics, scoring_ms=scoring_ms)


def split_messages(trace: Any) -> tuple[Messages, Messages]:
    """The trace's final branch as (what the model saw before its first reply, the rest)."""
    from verifiers.v1.dialects.chat import message_to_wire

    messages = [_clean(message_to_wire(m)) for m in trace.messages]
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    return messages[:first], messages[first:]


def _clean(message: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if v is not None}


_GENERATION_ERRORS = frozenset({"ProviderError", "InterceptionError"})


def trace_error(trace: Any, episode: Any) -> RolloutError | None:
    """The trace's last error (or the episode's) as a vfops rollout error; None when the
    rollout succeeded. A failed scoring hook is a scoring error: the reward is unknown."""
    if trace.ok and not episode.errors:
        return None
    found = trace.last_error or (episode.errors[-1] if episode.errors else None)
    if found is None:
        return RolloutError(type="RolloutError", message="rollout failed", stage="environment")
    stage: ErrorStage = "generation" if found.type in _GENERATION_ERRORS else "environment"
    kind = found.type
    if "scoring" in (found.message or "") and found.type == "TaskError":
        stage = "scoring"
        # a reward stopped by its scoring worker: named as vfops's own rewards name it
        kind = next((k for k in _CONTAINMENT if f"scoring: {k}: " in found.message), kind)
    return RolloutError(type=kind, message=(found.message or found.type)[:2000], stage=stage)


_CONTAINMENT = ("ScoringMemoryLimit", "ScoringWorkerDied")


def stop_reason(trace: Any, error: RolloutError | None) -> StopReason:
    condition = str(trace.stop_condition or "")
    if error is not None:
        return "error"
    if condition.endswith("_timeout"):
        return "timeout"
    if condition == "max_turns":
        return "max_turns"
    if trace.is_truncated:
        return "length"
    return "completed"


def _span_ms(span: Any) -> float:
    start, end = getattr(span, "start", 0.0), getattr(span, "end", 0.0)
    return (end - start) * 1000.0 if start and end and end >= start else 0.0


def _first_error(episode: Any) -> str:
    return episode.errors[-1].message if episode.errors else "the episode ran no agent"


def _failed_state(example: Example, index: int, error: RolloutError, started: float) -> State:
    return {
        "example_id": example.example_id,
        "rollout_index": index,
        "prompt": example.prompt,
        "completion": [],
        "answer": example.answer,
        "info": example.info,
        "task": example.task,
        "turn": 0,
        "responses": [],
        "usage": TokenUsage(),
        "stop_reason": "error",
        "error": error,
        "generation_ms": (time.perf_counter() - started) * 1000,
    }
