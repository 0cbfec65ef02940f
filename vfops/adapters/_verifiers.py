"""Environments written for ``verifiers`` (the 0.3 line's classic API), run by vfops.

``verifiers``' own objects run as ``verifiers`` runs them: its dataset formatting
(``get_eval_dataset`` / ``get_dataset``), its ``Environment.rollout`` (turns, stop
conditions, tools, ``env_response``), its rubric (``score_group``, which writes
``reward`` and ``metrics`` into its state) and its cleanup. What vfops supplies is
everything around one group: the model calls, the rows it records, the registry,
MLflow, sweeps and training.

Model calls go through vfops's client path: :func:`verifiers_client` is a ``verifiers``
``Client`` (its OpenAI chat-completions one, so prompts, tools, requests — sampling
arguments normalised as ``verifiers`` does it — and responses are converted by
``verifiers``' own code) whose transport is a vfops
:class:`~vfops.clients.ModelClient` — the pooled OpenAI client with its retries,
``Retry-After`` and shared budgets, the in-process local model, or a training
backend (whose responses carry the exact token ids and log-probs the trainer needs).

This module imports ``verifiers`` (seconds: it imports the ``anthropic`` and
``openai`` SDKs' types); it is imported only when a ``verifiers`` environment is
loaded. Not supported: ``verifiers``' env-server mode (``env_client``: a vfops
worker runs the environment in-process instead) and its own ``Client`` types
(``ClientConfig``, Anthropic, Responses API: vfops picks the transport).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import orjson

from vfops._errors import MissingExtraError, VfopsError
from vfops._rollout import ErrorStage, RolloutError, StopReason, TokenUsage
from vfops._tool_counts import FIRST_TOOL_ERROR, TOOL_CALLS, TOOL_ERRORS
from vfops._types import Message, Messages, SamplingArgs, State
from vfops.adapters._group import GroupEnvironment
from vfops.adapters._verifiers_scoring import contain_rewards, contained_error
from vfops.adapters._wire import completion_json
from vfops.clients import ChatResponse, ModelClient, PromptTooLongError
from vfops.costs import BudgetExhausted
from vfops.envs import Example
from vfops.rubrics import RolloutScore

if TYPE_CHECKING:
    from vfops.envs import EnvironmentEntry

SUPPORTED_VERIFIERS = ">=0.3.1,<0.4"
"""The ``verifiers`` releases whose classic environment API this adapter runs
(0.4 keeps only the ``verifiers.v1`` taskset API)."""

_RESPONSES_KEY = "vfops_responses"
"""Where :func:`verifiers_client` keeps each turn's vfops response in the ``verifiers``
state (the trainer reads their token ids; ``verifiers`` ignores unknown keys)."""


def _import_verifiers() -> Any:
    try:
        import verifiers as vf
    except ImportError as exc:
        raise MissingExtraError("verifiers", exc.name or "verifiers") from exc
    version = str(getattr(vf, "__version__", "0"))
    if not _supported(version):
        raise VfopsError(
            f"verifiers {version} is installed; vfops runs the classic environment API of "
            f"verifiers {SUPPORTED_VERIFIERS}: pip install 'vfops[verifiers]'"
        )
    _keep_signal_handlers()
    return vf


def _supported(version: str) -> bool:
    parts = [int(p) for p in version.split("+")[0].split(".")[:3] if p.isdigit()]
    release = tuple([*parts, 0, 0, 0][:3])
    return (0, 3, 1) <= release < (0, 4, 0)


def verifiers_version() -> str:
    """The installed ``verifiers`` version (for a run's provenance)."""
    from importlib.metadata import version

    return version("verifiers")


def load_verifiers_environment(entry: EnvironmentEntry, /, **kwargs: Any) -> VerifiersEnvironment:
    """``verifiers``' own ``load_environment(entry.name, **kwargs)``, wrapped for vfops."""
    vf = _import_verifiers()

    def factory(**args: Any) -> Any:
        # verifiers logs a failed load as an error before it raises it: the error line
        # vfops writes (build_verifiers_environment) says it once, with the fix
        with _logger_off(vf.load_environment.__module__):
            return vf.load_environment(entry.name, **args)

    # the package's signature, for the error of arguments that do not fit it; a module
    # that does not import is reported by verifiers' own import, just below
    with contextlib.suppress(Exception):
        factory.__wrapped__ = entry.load()  # type: ignore[attr-defined]
    return build_verifiers_environment(factory, entry.name, **kwargs)


@contextlib.contextmanager
def _logger_off(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    was_disabled, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = was_disabled


def build_verifiers_environment(
    factory: Callable[..., Any], name: str, /, **kwargs: Any
) -> VerifiersEnvironment:
    """``factory(**kwargs)`` (a package's ``load_environment``) wrapped for vfops, with the
    process's signal handlers kept (see :class:`_HandlersKeptByVfops`); any thread.
    ``factory`` and ``name`` are positional-only: every keyword is an environment argument."""
    vf = _import_verifiers()
    from vfops.envs import load_failure, quiet_datasets

    try:
        with quiet_datasets():
            vf_env = factory(**kwargs)
    except Exception as exc:
        cause = exc.__cause__ or exc  # verifiers wraps the package's error in its own
        raise load_failure(
            f"load_environment of verifiers environment '{name}' raised",
            cause,
            factory=factory,
            env_args=kwargs,
        ) from exc
    if not isinstance(vf_env, vf.Environment):
        raise VfopsError(
            f"load_environment of '{name}' returned {type(vf_env).__name__}, "
            "not a verifiers Environment"
        )
    return VerifiersEnvironment(vf_env, name=name)


class _HandlersKeptByVfops:
    """What ``verifiers``' environment module sees as ``signal``: the real module, except
    that ``signal.signal`` installs nothing.

    A ``verifiers`` environment installs SIGINT and SIGTERM handlers when it is built (a
    teardown, then ``exit(143)``). In a vfops evaluation they would end the run at an
    arbitrary point instead of recording it as interrupted with every row kept, and off
    the main thread (a Prefect task runs in a worker thread) ``signal.signal`` raises, so
    the environment could not be built at all. vfops keeps its own handlers and tears
    the environment down itself (:meth:`VerifiersEnvironment.aclose`).
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(signal, name)

    @staticmethod
    def signal(signalnum: int, handler: Any) -> Any:
        return signal.getsignal(signalnum)


def _keep_signal_handlers() -> None:
    from verifiers.legacy.envs import environment

    if not isinstance(environment.signal, _HandlersKeptByVfops):
        environment.signal = _HandlersKeptByVfops()


class VerifiersEnvironment(GroupEnvironment):
    """A ``verifiers`` ``Environment`` seen as a vfops :class:`Environment`.

    Rows are ``verifiers``' formatted rows (``prompt``, ``answer``, ``info``, ``task``,
    ``example_id``) and go back to its ``rollout`` unchanged. A group is rolled out and
    scored as ``verifiers``' own ``run_group`` does it (every rollout, then the rubric's
    ``score_group`` over the group, then its cleanup), each rollout inside vfops's
    concurrency limit. Its reward and per-function metrics are the ones ``verifiers``
    wrote into its state. A ``ToolEnv``'s rollouts also count their tool calls and
    failed tool calls (:mod:`vfops._tool_counts`; :func:`_count_tool_failures`).
    """

    library = "verifiers"

    def __init__(self, vf_env: Any, *, name: str) -> None:
        self.vf_env = vf_env
        self._counts_tools = _count_tool_failures(vf_env)
        # its sync rewards run in the eval's scoring workers (held here: registered weakly)
        self._contained = contain_rewards(vf_env)
        self._rows: dict[str, dict[int, dict[str, Any]]] = {}
        has_train = getattr(vf_env, "dataset_source", None) is not None
        has_eval = getattr(vf_env, "eval_dataset_source", None) is not None
        super().__init__(
            dataset=(lambda: self._split_rows("train")) if has_train else None,
            eval_dataset=(lambda: self._split_rows("eval")) if has_eval or not has_train else None,
            name=name,
        )
        self.sampling_args = {
            k: v
            for k, v in dict(vf_env.sampling_args or {}).items()
            if k not in ("n", "extra_body")
        }
        if dict(vf_env.sampling_args or {}).get("extra_body"):
            self.sampling_args["extra_body"] = dict(vf_env.sampling_args["extra_body"])

    async def aclose(self) -> None:
        """``verifiers``' teardown (its rubric's and the environment's ``@vf.teardown``
        handlers), which it would otherwise run only from its own signal handlers."""
        await self.vf_env._teardown()  # the one entry to them in verifiers 0.3

    # --- datasets -------------------------------------------------------------
    def _split_rows(self, split: str) -> list[dict[str, Any]]:
        """``verifiers``' formatted rows of ``split``, kept by example id for its rollout."""
        from vfops.envs import quiet_datasets

        with quiet_datasets():  # verifiers formats its rows with Dataset.map
            data = self.vf_env.get_dataset() if split == "train" else self.vf_env.get_eval_dataset()
            rows: list[dict[str, Any]] = data.to_list()
        self._rows[split] = {int(row["example_id"]): row for row in rows}
        return [_vfops_row(row) for row in rows]

    def _input_for(self, example: Example) -> dict[str, Any]:
        for split in ("eval", "train"):
            row = self._rows.get(split, {}).get(example.example_id)
            if row is not None and _same_prompt(row, example):
                return dict(row)
        # a row vfops built itself (e.g. a trainer's copy): verifiers' input fields
        return {
            "prompt": example.prompt,
            "example_id": example.example_id,
            "answer": example.answer,
            "info": example.info,
            "task": example.task,
        }

    # --- rollouts ---------------------------------------------------------------
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
        vf_env = self.vf_env
        sampling = self.merged_sampling_args(sampling_args)
        vf_client = verifiers_client(client)
        row = self._input_for(example)

        async def one() -> tuple[Any, list[str]]:
            failures: list[str] = []
            _TOOL_FAILURES.set(failures)  # in this rollout's own task (gather's)
            if limiter is None:
                return await vf_env.rollout(dict(row), vf_client, model, dict(sampling)), failures
            async with limiter:
                return await vf_env.rollout(dict(row), vf_client, model, dict(sampling)), failures

        started = time.perf_counter()
        rolled = list(await asyncio.gather(*(one() for _ in rollout_indices)))
        vf_states = [vf_state for vf_state, _ in rolled]
        generated = time.perf_counter()
        scorer = _scoring_env(vf_env, row)
        scoring_error: RolloutError | None = None
        try:
            if scorer.score_rollouts:
                await scorer.rubric.score_group(vf_states)
            else:
                await scorer.rubric.dummy_score_group(vf_states)
        except Exception as exc:  # verifiers' rubric raising: the group is unscored
            scoring_error = RolloutError.from_exception(exc, "scoring")
        scoring_ms = (time.perf_counter() - generated) * 1000.0
        for vf_state in vf_states:
            await scorer.rubric.cleanup(vf_state)
        states = [
            self._to_state(vf_state, example, index, (generated - started) * 1000.0)
            for vf_state, index in zip(vf_states, rollout_indices, strict=True)
        ]
        if self._counts_tools:
            for state, (_, failures) in zip(states, rolled, strict=True):
                _add_tool_counts(state, failures)
        scores = [_score(vf_state, scoring_error, scoring_ms) for vf_state in vf_states]
        return states, scores

    def _to_state(
        self, vf_state: Any, example: Example, rollout_index: int, group_ms: float
    ) -> State:
        usage = TokenUsage()
        responses: list[ChatResponse] = list(vf_state.get(_RESPONSES_KEY) or [])
        for response in responses:
            usage.add(response.prompt_tokens, response.completion_tokens, response.cached_tokens)
            usage.add_cost(response.cost_usd)
        error = _error(vf_state.get("error"))
        return {
            "example_id": example.example_id,
            "rollout_index": rollout_index,
            "prompt": to_messages(vf_state.get("prompt") or example.prompt),
            "completion": to_messages(vf_state.get("completion") or []),
            "answer": str(vf_state.get("answer", example.answer) or ""),
            "info": dict(vf_state.get("info") or example.info or {}),
            "task": str(vf_state.get("task_name", None) or example.task),
            "turn": len(vf_state.get("trajectory") or []),
            "responses": responses,
            "usage": usage,
            "stop_reason": _stop_reason(vf_state, error, int(getattr(self.vf_env, "max_turns", 0))),
            "error": error,
            "generation_ms": _generation_ms(vf_state, group_ms),
            "verifiers_stop_condition": vf_state.get("stop_condition"),
            # the model's own empty or invalid reply: verifiers scored it, vfops keeps that
            "error_scored": error is not None and error.type in _MODEL_BEHAVIOUR_ERRORS,
        }


_TOOL_FAILURES: ContextVar[list[str] | None] = ContextVar(
    "vfops_verifiers_tool_failures", default=None
)
"""The failed tool calls of the rollout running in this task, as ``verifiers``' tool
environments report them (see :func:`_count_tool_failures`)."""


def _count_tool_failures(vf_env: Any) -> bool:
    """Have every ``ToolEnv`` in ``vf_env`` (an ``EnvGroup``'s too) note its failed tool
    calls; whether there is one.

    ``verifiers`` 0.3 hands a tool's exception (and arguments that are not JSON) to the
    environment's ``error_formatter`` and sends its text to the model as the tool's
    answer; by default that text is the exception's message alone, which nothing tells
    from a result. So the formatter is wrapped: each call it gets is one failure, noted
    for the rollout running in the task (:data:`_TOOL_FAILURES`)."""
    import verifiers as vf

    found, pending = False, [vf_env]
    while pending:
        env = pending.pop()
        if isinstance(env, vf.EnvGroup):
            pending.extend(env.envs)
        elif isinstance(env, vf.ToolEnv):
            formatter = env.error_formatter
            if not getattr(formatter, "_vfops_counting", False):
                env.error_formatter = _counting(formatter)
            found = True
    return found


def _counting(format_error: Callable[[Exception], Any]) -> Callable[[Exception], Any]:
    def formatted(exc: Exception) -> Any:
        failures = _TOOL_FAILURES.get()
        if failures is not None:
            failures.append(f"{type(exc).__name__}: {exc}")
        return format_error(exc)

    formatted._vfops_counting = True  # type: ignore[attr-defined]
    return formatted


def _add_tool_counts(state: State, failures: list[str]) -> None:
    """The rollout's tool calls (each answered by a tool message) and its failures."""
    calls = sum(1 for message in state["completion"] if message.get("role") == "tool")
    state[TOOL_CALLS] = max(calls, len(failures))
    state[TOOL_ERRORS] = len(failures)
    state[FIRST_TOOL_ERROR] = failures[0] if failures else None


def _scoring_env(vf_env: Any, row: dict[str, Any]) -> Any:
    """The environment whose rubric scores ``row``'s group: an ``EnvGroup`` hands a group
    to the sub-environment its row routes to (``info["env_id"]``), rubric included, as
    its own ``run_group`` does; any other environment scores its own groups."""
    import verifiers as vf

    env, child = vf_env, row
    while isinstance(env, vf.EnvGroup):
        name, child, _ = env._route_child_input(child)  # verifiers' routing, pinned <0.4
        env = env.get_env_for_name(name)
    return env


def verifiers_client(model_client: ModelClient) -> Any:
    """A ``verifiers`` ``Client`` whose transport is ``model_client`` (see the module doc)."""
    return _client_class()(model_client)


_CLIENT_CLASS: type | None = None


def _client_class() -> type:
    """The client class, built once: it subclasses a ``verifiers`` class, so it can only
    be defined after ``verifiers`` is imported."""
    global _CLIENT_CLASS
    if _CLIENT_CLASS is None:
        _CLIENT_CLASS = _build_client_class()
    return _CLIENT_CLASS


def _build_client_class() -> type:
    _import_verifiers()
    from verifiers.legacy.clients.openai_chat_completions_client import (
        OpenAIChatCompletionsClient,
    )

    class _VfopsClient(OpenAIChatCompletionsClient):  # type: ignore[misc]
        """``verifiers``' chat-completions client over a vfops ``ModelClient``.

        ``verifiers``' own ``get_native_response`` builds each request — its sampling
        normalisation (``max_tokens`` renamed ``max_completion_tokens``, which OpenAI's
        reasoning models require; ``reasoning_effort`` routed by provider), ``extra_body``
        flattened, audio modality — and posts it through :class:`_Wire`, where vfops
        takes over: the body goes out through the vfops client.
        """

        def __init__(self, model_client: ModelClient) -> None:
            super().__init__(_Wire(model_client))

        def setup_client(self, config: Any) -> Any:
            raise VfopsError("verifiers_client wraps a vfops ModelClient; it takes no config")

        async def close(self) -> None:
            """The vfops client belongs to whoever made it (it outlives one group)."""

        async def get_native_response(
            self,
            prompt: Any,
            model: str,
            sampling_args: Any,
            tools: Any = None,
            **kwargs: Any,
        ) -> Any:
            turn: list[ChatResponse] = []
            token = _TURN_RESPONSES.set(turn)
            try:
                completion = await super().get_native_response(
                    prompt, model, sampling_args, tools, **kwargs
                )
            finally:
                _TURN_RESPONSES.reset(token)
            state = kwargs.get("state")
            if state is not None:
                state.setdefault(_RESPONSES_KEY, []).extend(turn)
            return completion

    return _VfopsClient


_TURN_RESPONSES: ContextVar[list[ChatResponse] | None] = ContextVar(
    "vfops_verifiers_turn", default=None
)
"""Where :class:`_Wire` leaves the vfops response of the request being made in this
task, for the client to keep in the rollout's state (``verifiers`` keeps only the
``ChatCompletion`` it parses from it)."""


class _Posted:
    """The part of an ``httpx.Response`` ``verifiers`` reads from a post: its bytes."""

    __slots__ = ("content",)

    def __init__(self, content: bytes) -> None:
        self.content = content


class _Wire:
    """What ``verifiers``' chat-completions client uses of its ``AsyncOpenAI``: the
    ``base_url`` (it routes ``reasoning_effort`` by provider) and ``post``, here sending
    the body it built through a vfops ``ModelClient``."""

    def __init__(self, model_client: ModelClient) -> None:
        self.model_client = model_client
        self.base_url = str(getattr(model_client, "base_url", None) or "")

    async def post(
        self, path: str, *, body: Mapping[str, Any], cast_to: Any, options: Any = None
    ) -> _Posted:
        from verifiers.legacy.errors import OverlongPromptError

        args = dict(body)
        model = str(args.pop("model"))
        messages = [_wire_message(m) for m in args.pop("messages")]
        tools = args.pop("tools", None)
        headers = (options or {}).get("headers")
        if headers:
            args["extra_headers"] = dict(headers)
        if args.get("n") == 1:
            del args["n"]
        try:
            response = await self.model_client.chat(
                model=model,
                messages=messages,
                sampling_args=args,
                tools=[dict(t) for t in tools] if tools else None,
            )
        except PromptTooLongError as exc:
            raise OverlongPromptError(str(exc)) from exc
        turn = _TURN_RESPONSES.get()
        if turn is not None:
            turn.append(response)
        return _Posted(orjson.dumps(completion_json(response, model)))


# --------------------------------------------------------------------------- conversions


def _wire_message(message: Any) -> dict[str, Any]:
    """An OpenAI message param (a dict from ``verifiers``' converter) without ``None``s,
    which some servers reject (``"tool_calls": null``)."""
    return {k: v for k, v in dict(message).items() if v is not None}


def to_messages(messages: Any) -> Messages:
    """``verifiers`` messages (pydantic models or dicts) as vfops/OpenAI message dicts."""
    if isinstance(messages, str):
        return [{"role": "assistant", "content": messages}]
    return [_to_message(m) for m in messages or []]


def _to_message(message: Any) -> Message:
    data: dict[str, Any] = (
        message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else dict(message)
    )
    out: Message = {"role": str(data.get("role", "user")), "content": data.get("content")}
    if data.get("tool_calls"):
        out["tool_calls"] = [_tool_call(call) for call in data["tool_calls"]]
    if data.get("tool_call_id"):
        out["tool_call_id"] = str(data["tool_call_id"])
    if data.get("reasoning_content"):
        out["reasoning_content"] = data["reasoning_content"]
    return out


def _tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    if "function" in call:
        return dict(call)
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": call.get("name"), "arguments": call.get("arguments") or "{}"},
    }


def _vfops_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A ``verifiers`` formatted row as the row vfops's dataset layer expects."""
    out: dict[str, Any] = {
        "prompt": to_messages(row.get("prompt") or []),
        "example_id": int(row["example_id"]),
        "answer": str(row.get("answer") or ""),
        "task": str(row.get("task") or "default"),
    }
    info = row.get("info")
    if isinstance(info, str):
        import json

        info = json.loads(info) if info else {}
    out["info"] = dict(info or {})
    return out


def _same_prompt(row: Mapping[str, Any], example: Example) -> bool:
    return to_messages(row.get("prompt") or []) == example.prompt


def _score(vf_state: Any, scoring_error: RolloutError | None, scoring_ms: float) -> RolloutScore:
    # a reward stopped by its worker's memory limit, or whose worker died: never scored
    scoring_error = scoring_error or contained_error(vf_state)
    if scoring_error is not None:
        return RolloutScore(reward=None, error=scoring_error, scoring_ms=scoring_ms)
    reward = vf_state.get("reward")
    metrics = {str(k): float(v) for k, v in dict(vf_state.get("metrics") or {}).items()}
    return RolloutScore(
        reward=None if reward is None else float(reward), metrics=metrics, scoring_ms=scoring_ms
    )


def _error(vf_error: Any) -> RolloutError | None:
    """``verifiers``' error of a rollout (a ``vf.Error`` wrapping the cause, e.g. a
    ``ModelError`` around the client's exception) as a vfops rollout error."""
    if vf_error is None:
        return None
    cause = vf_error
    while getattr(cause, "__cause__", None) is not None:
        cause = cause.__cause__
    if isinstance(cause, BudgetExhausted):  # a cap was reached: the run stops here
        raise cause
    stage: ErrorStage = (
        "generation" if type(vf_error).__name__ in _GENERATION_ERRORS else "environment"
    )
    message = str(cause) or str(vf_error) or type(cause).__name__
    return RolloutError(type=type(cause).__name__, message=message[:2000], stage=stage)


_MODEL_BEHAVIOUR_ERRORS = frozenset({"EmptyModelResponseError", "InvalidModelResponseError"})
"""The model answered, but not usefully: a sample of its behaviour that ``verifiers``
scores (unlike a call that failed, which says nothing about the model)."""

_GENERATION_ERRORS = frozenset(
    {"ModelError", "EmptyModelResponseError", "InvalidModelResponseError", "OverlongPromptError"}
)


def _stop_reason(vf_state: Any, error: RolloutError | None, max_turns: int) -> StopReason:
    condition = str(vf_state.get("stop_condition") or "")
    if condition in ("prompt_too_long", "overlong_prompt") or (
        error is not None and error.type == "OverlongPromptError"
    ):
        return "prompt_too_long"
    if error is not None or condition == "has_error":
        return "error"
    if condition == "max_turns_reached" or condition.startswith("max_turns"):
        # a single-turn environment's one turn is its whole rollout (vfops says completed)
        return "completed" if max_turns == 1 else "max_turns"
    if condition == "timeout_reached":
        return "timeout"
    if vf_state.get("is_truncated"):
        return "length"
    return "completed"


def _generation_ms(vf_state: Any, group_ms: float) -> float:
    timing = vf_state.get("timing")
    span = getattr(timing, "generation", None)
    start, end = getattr(span, "start", 0.0), getattr(span, "end", 0.0)
    if start and end and end >= start:
        return (end - start) * 1000.0
    return group_ms
