"""Multi-turn environments: the model and the environment take turns."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from vfops._rollout import RolloutError
from vfops._types import Messages, SamplingArgs, State
from vfops.clients import ChatResponse, ModelClient, PromptTooLongError
from vfops.costs import BudgetExhausted
from vfops.envs._dataset import Example
from vfops.envs._environment import Environment, new_state


class MultiTurnEnv(Environment):
    """An environment that answers each assistant turn until a stop condition.

    Override :meth:`env_response` (the environment's reply) and optionally
    :meth:`setup_state` and :meth:`is_completed`. A rollout stops when
    ``is_completed`` returns True or ``env_response`` sets ``state["done"]``
    (stop reason ``completed``), after ``max_turns`` assistant turns
    (``max_turns``), when the model hits its token limit (``length``), when the
    server refuses the context (``prompt_too_long``), after ``timeout_seconds``
    (``timeout``), or when the model call or the environment raises (``error``).
    """

    def __init__(
        self, *, max_turns: int = 10, timeout_seconds: float | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.max_turns = max_turns
        self.timeout_seconds = timeout_seconds

    # --- hooks for subclasses ---------------------------------------------------
    async def setup_state(self, state: State) -> State:
        """Prepare per-rollout state (e.g. a game board) before the first turn."""
        return state

    async def is_completed(self, messages: Messages, state: State) -> bool:
        """Whether the rollout is over, checked after each assistant turn."""
        return bool(state.get("done", False))

    async def env_response(self, messages: Messages, state: State) -> Messages:
        """The environment's reply to the last assistant message."""
        raise NotImplementedError(f"{type(self).__name__} must implement env_response")

    def tool_schemas(self, state: State) -> list[dict[str, Any]] | None:
        """OpenAI tool schemas offered to the model (ToolEnv overrides this)."""
        return None

    # --- the loop -----------------------------------------------------------------
    async def rollout(
        self,
        client: ModelClient,
        model: str,
        example: Example,
        *,
        rollout_index: int = 0,
        sampling_args: SamplingArgs | None = None,
    ) -> State:
        state = new_state(example, rollout_index)
        started = time.perf_counter()
        try:
            state = await self.setup_state(state)
            if self.timeout_seconds is None:
                await self._turns(client, model, state, sampling_args or {})
            else:
                async with asyncio.timeout(self.timeout_seconds):
                    await self._turns(client, model, state, sampling_args or {})
        except TimeoutError:
            state["stop_reason"] = "timeout"
        except PromptTooLongError:
            state["stop_reason"] = "prompt_too_long"
        except BudgetExhausted:  # the run stops; this rollout is not recorded
            raise
        except _EnvironmentFailure as failure:
            state["stop_reason"] = "error"
            state["error"] = RolloutError.from_exception(failure.cause, "environment")
        except Exception as exc:  # a model call failed after its retries
            state["stop_reason"] = "error"
            state["error"] = RolloutError.from_exception(exc, "generation")
        finally:
            # shielded: a cancelled rollout (Ctrl-C) still gives back what it held
            await asyncio.shield(self.cleanup_state(state))
        state["generation_ms"] = (time.perf_counter() - started) * 1000.0
        return state

    async def cleanup_state(self, state: State) -> None:
        """Give back what :meth:`setup_state` took (a sandbox, a connection); runs when
        the rollout ends however it ends, before it is scored."""

    async def _turns(
        self, client: ModelClient, model: str, state: State, sampling_args: SamplingArgs
    ) -> None:
        completion: Messages = state["completion"]
        while True:
            messages = [*state["prompt"], *completion]
            response = await client.chat(
                model=model,
                messages=messages,
                sampling_args=sampling_args,
                tools=self.tool_schemas(state),
            )
            self._record_response(state, response)
            completion.append(response.message)
            messages.append(response.message)
            if response.finish_reason == "length":
                state["stop_reason"] = "length"
                return
            if await self._guarded(self.is_completed(messages, state)):
                state["stop_reason"] = "completed"
                return
            if 0 < self.max_turns <= state["turn"]:
                state["stop_reason"] = "max_turns"
                return
            reply = await self._guarded(self.env_response(messages, state))
            completion.extend(reply)
            if state.get("done"):
                state["stop_reason"] = "completed"
                return

    @staticmethod
    def _record_response(state: State, response: ChatResponse) -> None:
        state["turn"] += 1
        state["responses"].append(response)
        usage = state["usage"]
        usage.add(response.prompt_tokens, response.completion_tokens, response.cached_tokens)
        usage.add_cost(response.cost_usd)

    @staticmethod
    async def _guarded(awaitable: Any) -> Any:
        # Environment code raising is the environment's fault, not the model's:
        # tag it so the record says stage "environment".
        try:
            return await awaitable
        except (TimeoutError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise _EnvironmentFailure(exc) from exc


class _EnvironmentFailure(Exception):
    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class SingleTurnEnv(MultiTurnEnv):
    """One model turn per rollout: question in, answer out."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_turns", 1)
        super().__init__(**kwargs)

    async def is_completed(self, messages: Messages, state: State) -> bool:
        return True
