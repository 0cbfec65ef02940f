"""Generation through a vLLM server: token-in/token-out turns, and the backend.

:class:`VLLMBackend` implements :class:`~vfops.training._backend.GenerationBackend`
against a vLLM OpenAI-compatible server started by ``vfops vllm serve`` (see
``vfops/training/VLLM.md``). Its parts, one job each: this module's client (the
turns), :mod:`vfops.training._vllm_server` (the config, the HTTP routes, the
errors) and :mod:`vfops.training._vllm_sync` (weight sync, filesystem or NCCL, after
each optimizer step).

Generation uses ``/v1/completions`` with a **token-id prompt**: chat messages are
rendered with the tokenizer's chat template here (tools included), so the exact ids
the model is conditioned on are known, and the server returns the sampled ids
(``return_token_ids``) and their log-probabilities (``logprobs``; the server runs
with ``--logprobs-mode processed_logprobs`` so they are at the sampling temperature).
Tool calls are parsed from the completion text, as with the in-process model.

Multi-turn prompts continue from the previous turn's exact tokens, by the same
strategy as the in-process backend (:mod:`vfops.training._continuation`, chosen
by ``multiturn_tokens``): the client remembers each turn it produced, keyed on
the conversation, so it works whatever task runs a turn. Each response says how
its prompt was made in ``raw["vfops_prompt_source"]`` (``"continued"``,
``"rendered"`` or ``"given"``). The core can override all of this with
``prompt_ids_fn``.

Heavy imports (torch, safetensors, vllm) happen inside functions only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vfops._types import Message, Messages, SamplingArgs
from vfops.clients import ChatResponse, MalformedResponseError
from vfops.training._backend import TOKENS_KEY, SamplingArgsError, TurnTokens
from vfops.training._continuation import (
    PROMPT_SOURCE_KEY,
    PromptSource,
    TokenMode,
    Turn,
    TurnMemory,
)
from vfops.training._vllm_server import VLLMBackendError, VLLMGenerationConfig, VLLMServer
from vfops.training._vllm_sync import (
    ChannelFactory,
    NcclChannel,
    WeightSync,
    open_vllm_nccl_channel,
)

if TYPE_CHECKING:
    import torch

    from vfops.clients import ModelClient

__all__ = [
    "PROMPT_SOURCE_KEY",
    "ChannelFactory",
    "NcclChannel",
    "VLLMBackend",
    "VLLMBackendError",
    "VLLMClient",
    "VLLMGenerationConfig",
    "open_vllm_nccl_channel",
]


# --------------------------------------------------------------------------- client

# Sampling args passed to vLLM's completions endpoint as they are.
_PASSTHROUGH = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "stop_token_ids",
    "ignore_eos",
)


def _completion_body(
    model: str, prompt_ids: list[int], sampling_args: SamplingArgs | None
) -> dict[str, Any]:
    args: dict[str, Any] = dict(sampling_args or {})
    extra = args.pop("extra_body", None)
    if isinstance(extra, dict):
        args.update(extra)
    if int(args.get("n") or 1) != 1:
        raise SamplingArgsError(
            "VLLMBackend's client returns one message; sampling_args n must be 1"
        )
    if args.get("stream"):
        raise SamplingArgsError("VLLMBackend's client does not stream; drop 'stream'")
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt_ids,
        "n": 1,
        "logprobs": 0,  # the sampled token's log-probability only
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,  # fallback for servers without return_token_ids
        "skip_special_tokens": False,
    }
    cap = args.get("max_completion_tokens", args.get("max_tokens"))
    if cap is not None:
        body["max_tokens"] = int(cap)
    for key in _PASSTHROUGH:
        if args.get(key) is not None:
            body[key] = args[key]
    body.setdefault("temperature", 1.0)
    return body


def _completion_tokens(choice: dict[str, Any]) -> tuple[list[int], list[float]]:
    logprobs = choice.get("logprobs") or {}
    values = logprobs.get("token_logprobs")
    ids = choice.get("token_ids")
    if ids is None and logprobs.get("tokens") is not None:
        # return_tokens_as_token_ids renders each token as "token_id:<id>".
        ids = [int(str(t).rsplit(":", 1)[-1]) for t in logprobs["tokens"]]
    if ids is None or values is None:
        raise MalformedResponseError(
            "vLLM response has no token ids or logprobs; use vLLM >= 0.10.2 "
            "started by `vfops vllm serve`"
        )
    if len(ids) != len(values):
        raise MalformedResponseError(
            f"vLLM returned {len(ids)} token ids but {len(values)} logprobs"
        )
    floats = [float("-inf") if v is None else float(v) for v in values]
    return [int(i) for i in ids], floats


class VLLMClient:
    """The :class:`~vfops.clients.ModelClient` of :class:`VLLMBackend`.

    Every response's ``raw`` holds :data:`TOKENS_KEY` -> :class:`TurnTokens`, the
    server's response under ``"completion"`` and :data:`PROMPT_SOURCE_KEY`.
    """

    def __init__(
        self,
        backend: VLLMBackend,
        memory: TurnMemory,
        prompt_ids_fn: Callable[[Messages, list[dict[str, Any]] | None], list[int] | None]
        | None = None,
    ) -> None:
        self._backend = backend
        self.memory = memory
        self._prompt_ids_fn = prompt_ids_fn

    @property
    def prefix_breaks(self) -> int:
        """Continued turns whose exact tokens differ from re-rendering the messages."""
        return self.memory.prefix_breaks

    def prompt_ids(
        self, messages: Messages, tools: list[dict[str, Any]] | None = None
    ) -> tuple[list[int], PromptSource]:
        """The prompt ids the next ``chat`` with these messages would send."""
        return self._prompt(messages, tools, take=False)

    def _prompt(
        self, messages: Messages, tools: list[dict[str, Any]] | None, *, take: bool
    ) -> tuple[list[int], PromptSource]:
        if self._prompt_ids_fn is not None:
            given = self._prompt_ids_fn(messages, tools)
            if given is not None:
                return list(given), "given"
        prompt = self.memory.prompt(messages, tools, take=take)
        return prompt.ids, prompt.source

    async def chat(
        self,
        *,
        model: str,
        messages: Messages,
        sampling_args: SamplingArgs | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatResponse:
        backend = self._backend
        served = await backend.served_model()
        prompt_ids, source = self._prompt(messages, tools, take=True)
        body = _completion_body(served, prompt_ids, sampling_args)
        version = backend.policy_version
        data = await backend.server.completion(body)
        try:
            choice = data["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise MalformedResponseError(
                f"vLLM response has no choices[0]: {str(data)[:200]}"
            ) from None
        completion_ids, logprobs = _completion_tokens(choice)
        message, finish = self._message(completion_ids, choice.get("finish_reason"), tools)
        self.memory.remember(messages, tools, message, Turn.of(prompt_ids, completion_ids))
        tokens: TurnTokens = {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "completion_logprobs": logprobs,
            "temperature": float(body["temperature"]),
            "policy_version": version,
        }
        return ChatResponse(
            message=message,
            finish_reason=finish,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(completion_ids),
            raw={TOKENS_KEY: tokens, PROMPT_SOURCE_KEY: source, "completion": data},
        )

    def _message(
        self, completion_ids: list[int], finish: str | None, tools: list[dict[str, Any]] | None
    ) -> tuple[Message, str | None]:
        from vfops.local import assistant_message

        # Decoded here (not the server's text) so content always matches the ids.
        text = str(self.memory.tokenizer.decode(completion_ids, skip_special_tokens=True))
        message, kind = assistant_message(text, tools, truncated=finish == "length")
        return message, kind if kind == "tool_calls" else finish

    async def aclose(self) -> None:
        """The backend owns the connection; close it with ``VLLMBackend.aclose``."""


# --------------------------------------------------------------------------- backend


class VLLMBackend:
    """A :class:`~vfops.training._backend.GenerationBackend` over a vLLM server.

    ``tokenizer`` must be the served model's (the trainer's). ``multiturn_tokens``:
    how later turns' prompts are made (``[generation] multiturn_tokens``, see
    :mod:`vfops.training._continuation`). ``prompt_ids_fn``, if given, is asked
    first for each turn's prompt ids (``None`` = let the backend build them).
    ``nccl_channel`` replaces the NCCL data plane (tests).
    Create, use and close it inside one event loop.
    """

    def __init__(
        self,
        config: VLLMGenerationConfig,
        tokenizer: Any,
        *,
        multiturn_tokens: TokenMode = "continue",
        prompt_ids_fn: Callable[[Messages, list[dict[str, Any]] | None], list[int] | None]
        | None = None,
        nccl_channel: ChannelFactory | None = None,
    ) -> None:
        if tokenizer is None or not callable(getattr(tokenizer, "apply_chat_template", None)):
            raise VLLMBackendError(
                "VLLMBackend needs the served model's tokenizer (with a chat template); "
                "pass AutoTokenizer.from_pretrained(MODEL_DIR)"
            )
        self.config = config
        self.server = VLLMServer(config)
        self.policy_version = 0
        self.syncs = 0
        self._served: str | None = config.model
        self._client = VLLMClient(
            self,
            TurnMemory(tokenizer, mode=multiturn_tokens, capacity=config.prompt_cache_size),
            prompt_ids_fn,
        )
        self._weights = WeightSync(config, self.server, nccl_channel)
        self._sync_lock = asyncio.Lock()

    @classmethod
    def from_config(
        cls, config: VLLMGenerationConfig, tokenizer: Any, **kwargs: Any
    ) -> VLLMBackend:
        """The backend for ``config`` (a :class:`VLLMGenerationConfig`)."""
        if not isinstance(config, VLLMGenerationConfig):
            raise VLLMBackendError(
                f"VLLMBackend.from_config needs a VLLMGenerationConfig, got {type(config).__name__}"
            )
        return cls(config, tokenizer, **kwargs)

    @property
    def client(self) -> ModelClient:
        return self._client

    @property
    def vllm_client(self) -> VLLMClient:
        """The client with its extra ``prompt_ids`` method."""
        return self._client

    @property
    def prefix_breaks(self) -> int:
        """Continued turns whose exact tokens differ from re-rendering the messages."""
        return self._client.prefix_breaks

    async def served_model(self) -> str:
        """The served model name (asked once from ``/v1/models`` when not configured)."""
        if self._served is None:
            data = await self.server.admin("GET", "/v1/models", what="listing models")
            try:
                self._served = str(data["data"][0]["id"])
            except (KeyError, IndexError, TypeError):
                raise VLLMBackendError(
                    f"vLLM server at {self.server.root} lists no model; set generation.model"
                ) from None
        return self._served

    async def sync_weights(self, model: torch.nn.Module, policy_version: int) -> float:
        """Load ``model``'s weights into the server; seconds taken. Turns started
        after this returns carry ``policy_version``."""
        async with self._sync_lock:
            start = time.perf_counter()
            await self._weights.load(model, policy_version)
            self.policy_version = policy_version
            self.syncs += 1
            return time.perf_counter() - start

    async def aclose(self) -> None:
        await self._weights.close_channel()
        await self.server.aclose()
        self._weights.remove_own_sync_dir()

    async def __aenter__(self) -> VLLMBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
