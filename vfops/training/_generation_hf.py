"""In-process Hugging Face generation backend (CPU and small runs).

Heavy module (torch): imported lazily by :mod:`vfops.training`.

The backend keeps its own copy of the policy (``sync_weights`` copies the
trainer's weights in), so generation can run ahead of training on another
thread. Sampling is :class:`~vfops.local._batched.BatchedGenerator`'s, the same
micro-batched token loop as :class:`~vfops.local.LocalModelClient`: concurrent
``chat`` calls share one forward pass per token, and each sampled token comes
with its log-probability under the tempered softmax. Its
:class:`HFGenerationClient` is an ordinary ``ModelClient`` whose responses
carry :class:`~vfops.training._backend.TurnTokens`.

Draws are reproducible: each turn samples from its own ``torch.Generator``
seeded from (request seed, conversation ordinal, turn), so results do not
depend on which requests happened to share a batch. Multi-turn prompts continue
from the exact tokens of earlier turns (:mod:`vfops.training._continuation`,
the same strategy as the vLLM backend).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

from vfops._types import Messages, SamplingArgs
from vfops.clients import ChatResponse, ModelClient
from vfops.local import (
    BatchedGenerator,
    ComputeRunner,
    Sampled,
    Sampling,
    assistant_message,
    derive_seed,
)
from vfops.training._backend import TOKENS_KEY, SamplingArgsError, TurnTokens
from vfops.training._continuation import PROMPT_SOURCE_KEY, Prompt, TokenMode, Turn, TurnMemory
from vfops.training._weights import trained_state_dict

_UNSUPPORTED = ("top_p", "top_k", "min_p", "repetition_penalty", "stop", "n")
_NEUTRAL = {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "n": 1}


class HFGenerationClient:
    """ModelClient over the backend's model; see the module docstring."""

    def __init__(self, backend: HFBackend, memory: TurnMemory) -> None:
        self._backend = backend
        self.memory = memory
        self._ordinals: dict[int, int] = {}
        self.turns = 0

    @property
    def prefix_breaks(self) -> int:
        """Continued turns whose exact tokens differ from re-rendering the messages."""
        return self.memory.prefix_breaks

    async def chat(
        self,
        *,
        model: str,
        messages: Messages,
        sampling_args: SamplingArgs | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatResponse:
        args = _check_args(sampling_args or {})
        generator = self._backend.generator
        prompt = self.memory.prompt(messages, tools)
        room = generator.room(prompt.ids)
        seed_base = int(args.get("seed", self._backend.seed))
        if prompt.previous is None:
            conversation = self._ordinals.get(seed_base, 0)
            self._ordinals[seed_base] = conversation + 1
            turn = 0
        else:
            conversation, turn = prompt.previous.conversation, prompt.previous.index + 1
        sampling = Sampling(
            max_new_tokens=min(int(args.get("max_tokens", 64)), room),
            seed=derive_seed(seed_base, conversation, turn),
            temperature=float(args.get("temperature", 1.0)),
        )
        sampled = await generator.generate(prompt.ids, sampling)
        self.turns += 1
        response = self._response(model, prompt, sampling, sampled, tools)
        self.memory.remember(
            messages,
            tools,
            response.message,
            Turn.of(prompt.ids, sampled.token_ids, conversation, turn),
        )
        return response

    async def aclose(self) -> None:
        """The backend owns the generator; close it with ``HFBackend.aclose``."""

    def _response(
        self,
        model: str,
        prompt: Prompt,
        sampling: Sampling,
        sampled: Sampled,
        tools: list[dict[str, Any]] | None,
    ) -> ChatResponse:
        tokenizer = self._backend.tokenizer
        text = str(tokenizer.decode(sampled.token_ids, skip_special_tokens=True))
        message, finish = assistant_message(text, tools, truncated=not sampled.hit_eos)
        tokens = TurnTokens(
            prompt_ids=prompt.ids,
            completion_ids=sampled.token_ids,
            completion_logprobs=sampled.logprobs,
            temperature=sampling.temperature,
            policy_version=sampled.version,
        )
        return ChatResponse(
            message=message,
            finish_reason=finish,
            prompt_tokens=len(prompt.ids),
            completion_tokens=len(sampled.token_ids),
            raw={
                "model": model,
                TOKENS_KEY: tokens,
                PROMPT_SOURCE_KEY: prompt.source,
                "prefix_consistent": prompt.consistent,
            },
        )


class HFBackend:
    """:class:`~vfops.training._backend.GenerationBackend` running in this process."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        multiturn_tokens: TokenMode = "continue",
        seed: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        # A private copy: generation may run on another thread while training updates
        # the trainer's weights; they meet only in sync_weights, under the lock.
        own: Any = copy.deepcopy(_base_model(model)).eval()
        for p in own.parameters():
            p.requires_grad_(False)
        self.generator = BatchedGenerator(
            own, tokenizer, max_batch_size=max_batch_size, split_cpu_threads=True
        )
        self.multiturn_tokens = multiturn_tokens
        self.seed = seed
        self._client = HFGenerationClient(self, TurnMemory(tokenizer, mode=multiturn_tokens))

    @property
    def model(self) -> Any:
        return self.generator.model

    @property
    def policy_version(self) -> int:
        return self.generator.version

    @property
    def client(self) -> ModelClient:
        return self._client

    @property
    def prefix_breaks(self) -> int:
        return self._client.prefix_breaks

    @property
    def run_compute(self) -> ComputeRunner:
        """Where the torch work runs; the recipe points it at its training thread when
        generation does not overlap training (see ``MainThreadCompute``)."""
        return self.generator.run_compute

    @run_compute.setter
    def run_compute(self, runner: ComputeRunner) -> None:
        self.generator.run_compute = runner

    @property
    def sample(self) -> Callable[[list[Any]], list[Sampled]]:
        """The token loop over one batch (``bench/train_step_vfops.py`` wraps it to time it)."""
        return self.generator.sample_batch

    @sample.setter
    def sample(self, fn: Callable[[list[Any]], list[Sampled]]) -> None:
        self.generator.sample_batch = fn

    async def sync_weights(self, model: Any, policy_version: int) -> float:
        started = time.perf_counter()
        # the copy was made from the policy: only what training changes moves
        state = trained_state_dict(model)
        await self.generator.run_compute(self.generator.load_state, state, policy_version)
        return time.perf_counter() - started

    async def aclose(self) -> None:
        await self.generator.aclose()


def _base_model(model: Any) -> Any:
    """The plain transformers model to copy (peft adapters are merged in by sync)."""
    get_base = getattr(model, "get_base_model", None)
    if get_base is None:
        return model
    base = copy.deepcopy(model).merge_and_unload()
    return base


def _check_args(args: SamplingArgs) -> dict[str, Any]:
    merged: dict[str, Any] = dict(args)
    extra = merged.pop("extra_body", None)
    if isinstance(extra, dict):
        merged.update(extra)
    for key in _UNSUPPORTED:
        value = merged.get(key)
        if value is not None and value != _NEUTRAL.get(key):
            # The loss needs the behaviour policy's exact logprobs: truncated
            # sampling would make them wrong, so refuse instead of ignoring.
            raise SamplingArgsError(
                f"the hf training backend does not support {key}={value!r}; drop it from the "
                "environment's sampling_args (the loss needs untruncated log-probs)"
            )
    if "max_completion_tokens" in merged and merged["max_completion_tokens"] is not None:
        merged["max_tokens"] = merged["max_completion_tokens"]
    return {k: v for k, v in merged.items() if v is not None}
