"""In-process Hugging Face generation backend (CPU and small runs).

Heavy module (torch): imported lazily by :mod:`vfops.training`.

The backend keeps its own copy of the policy (``sync_weights`` copies the
trainer's weights in), so generation can run ahead of training on another
thread. Its :class:`HFGenerationClient` is an ordinary ``ModelClient``:
concurrent ``chat`` calls are micro-batched into one forward pass per token, and
every response carries :class:`~vfops.training._backend.TurnTokens`.

Sampling is a hand-written loop (not ``model.generate``) because training needs
the exact log-probability of each sampled token under the tempered softmax, and
reproducible draws: each turn samples from its own ``torch.Generator`` seeded
from (request seed, conversation ordinal, turn), so results do not depend on
which requests happened to share a batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import copy
import functools
import hashlib
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from vfops._types import Message, Messages, SamplingArgs
from vfops.clients._base import ChatResponse, ModelClient, PromptTooLongError
from vfops.local._client import _TOOL_CALL_RE, _parse_tool_calls
from vfops.training._backend import TOKENS_KEY, TurnTokens
from vfops.training._tokens import TemplateError, prompt_ids, suffix_ids
from vfops.training._weights import full_state_dict

_T = TypeVar("_T")

ComputeRunner = Callable[..., Awaitable[Any]]
"""``await run(fn, *args)``: run blocking torch work ``fn(*args)`` somewhere, return its result."""

_UNSUPPORTED = ("top_p", "top_k", "min_p", "repetition_penalty", "stop", "n")
_NEUTRAL = {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "n": 1}


@dataclass(slots=True)
class _Conversation:
    """The exact tokens of one rollout so far (for token-in continuation)."""

    messages: list[Message]
    assistant: Message
    prompt_ids: list[int]
    completion_ids: list[int]
    hit_eos: bool
    ordinal: int
    seed: int
    turns: int


# Which rollout a ``chat`` call belongs to. The client only sees messages, so the
# conversation's exact tokens travel in a ContextVar: every rollout of
# ``Environment.run_group`` runs in its own asyncio task (``asyncio.gather``),
# and each task has its own copy of the context, so a value set during a
# rollout's first turn is seen by its later turns and by no other rollout. The
# stored messages are compared with the incoming ones before continuing, so a
# task that reuses the context for an unrelated conversation starts afresh.
_CONVERSATION: contextvars.ContextVar[_Conversation | None] = contextvars.ContextVar(
    "vfops_training_conversation", default=None
)


@dataclass(slots=True)
class _Request:
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float
    seed: int
    future: asyncio.Future[_Sampled]


@dataclass(slots=True)
class _Sampled:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    hit_eos: bool = False
    policy_version: int = 0


class HFGenerationClient:
    """ModelClient over the backend's model; see the module docstring."""

    def __init__(self, backend: HFBackend) -> None:
        self._backend = backend
        self._queue: list[_Request] = []
        self._drainer: asyncio.Task[None] | None = None
        self._ordinals: dict[int, int] = {}
        self.prefix_breaks = 0
        """Continued turns whose exact tokens differ from re-rendering the messages."""
        self.turns = 0

    async def chat(
        self,
        *,
        model: str,
        messages: Messages,
        sampling_args: SamplingArgs | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatResponse:
        args = _check_args(sampling_args or {})
        backend = self._backend
        conversation = self._continued(messages)
        consistent = True
        if conversation is not None:
            new = list(messages[len(conversation.messages) + 1 :])
            try:
                ids = [
                    *conversation.prompt_ids,
                    *conversation.completion_ids,
                    *suffix_ids(
                        backend.tokenizer,
                        new,
                        tools,
                        last_sampled_id=(
                            conversation.completion_ids[-1] if conversation.hit_eos else None
                        ),
                    ),
                ]
            except TemplateError:
                conversation, ids = None, prompt_ids(backend.tokenizer, messages, tools)
            else:
                consistent = ids == prompt_ids(backend.tokenizer, messages, tools)
                self.prefix_breaks += 0 if consistent else 1
        else:
            ids = prompt_ids(backend.tokenizer, messages, tools)
        room = backend.max_positions - len(ids)
        if room < 1:
            raise PromptTooLongError(
                f"prompt has {len(ids)} tokens; the model's context is {backend.max_positions}"
            )
        seed_base = int(args.get("seed", backend.seed))
        if conversation is None:
            ordinal = self._ordinals.get(seed_base, 0)
            self._ordinals[seed_base] = ordinal + 1
            turn = 0
        else:
            ordinal, turn = conversation.ordinal, conversation.turns
        loop = asyncio.get_running_loop()
        request = _Request(
            prompt_ids=ids,
            max_new_tokens=min(int(args.get("max_tokens", 64)), room),
            temperature=float(args.get("temperature", 1.0)),
            seed=_derive_seed(seed_base, ordinal, turn),
            future=loop.create_future(),
        )
        self._queue.append(request)
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain())
        sampled = await request.future
        self.turns += 1
        response = self._response(model, request, sampled, tools, consistent)
        _CONVERSATION.set(
            _Conversation(
                messages=[dict(m) for m in messages],
                assistant=response.message,
                prompt_ids=ids,
                completion_ids=sampled.token_ids,
                hit_eos=sampled.hit_eos,
                ordinal=ordinal,
                seed=seed_base,
                turns=turn + 1,
            )
        )
        return response

    async def aclose(self) -> None:
        if self._drainer is not None and not self._drainer.done():
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(self._drainer)

    def _continued(self, messages: Messages) -> _Conversation | None:
        if self._backend.multiturn_tokens != "continue":
            return None
        conversation = _CONVERSATION.get()
        if conversation is None:
            return None
        n = len(conversation.messages)
        if (
            len(messages) <= n + 1
            or [dict(m) for m in messages[:n]] != conversation.messages
            or dict(messages[n]) != dict(conversation.assistant)
        ):
            return None
        return conversation

    async def _drain(self) -> None:
        while self._queue:
            await self._settle()
            batch = self._queue[: self._backend.max_batch_size]
            self._queue = self._queue[len(batch) :]
            try:
                results = await self._backend.run_compute(self._backend.sample, batch)
            except Exception as exc:
                for req in batch:
                    if not req.future.done():
                        req.future.set_exception(exc)
                continue
            for req, res in zip(batch, results, strict=True):
                if not req.future.done():
                    req.future.set_result(res)

    async def _settle(self) -> None:
        """Let every rollout that is ready to ask queue its request before a batch is cut.

        A batch's padding changes the float rounding of the logits, so its composition
        must not depend on thread timing: then runs (and a resumed run) are reproducible.
        Rollouts waiting on real I/O still join whichever batch is next.
        """
        seen = -1
        while len(self._queue) != seen:
            seen = len(self._queue)
            for _ in range(4):
                await asyncio.sleep(0)

    def _response(
        self,
        model: str,
        request: _Request,
        sampled: _Sampled,
        tools: list[dict[str, Any]] | None,
        consistent: bool,
    ) -> ChatResponse:
        text = str(self._backend.tokenizer.decode(sampled.token_ids, skip_special_tokens=True))
        finish = "stop" if sampled.hit_eos else "length"
        message: Message = {"role": "assistant", "content": text}
        if tools:
            calls = _parse_tool_calls(text)
            if calls:
                message["tool_calls"] = calls
                first = _TOOL_CALL_RE.search(text)
                message["content"] = text[: first.start()].rstrip() if first else text
                finish = "tool_calls" if sampled.hit_eos else finish
        tokens = TurnTokens(
            prompt_ids=request.prompt_ids,
            completion_ids=sampled.token_ids,
            completion_logprobs=sampled.logprobs,
            temperature=request.temperature,
            policy_version=sampled.policy_version,
        )
        return ChatResponse(
            message=message,
            finish_reason=finish,
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=len(sampled.token_ids),
            raw={"model": model, TOKENS_KEY: tokens, "prefix_consistent": consistent},
        )


class HFBackend:
    """:class:`~vfops.training._backend.GenerationBackend` running in this process."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        multiturn_tokens: str = "continue",
        seed: int = 0,
    ) -> None:
        import torch

        self._torch = torch
        self.tokenizer = tokenizer
        # A private copy: generation may run on another thread while training updates
        # the trainer's weights; they meet only in sync_weights, under the lock.
        self.model: Any = copy.deepcopy(_base_model(model)).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.max_batch_size = max_batch_size
        self.multiturn_tokens = multiturn_tokens
        self.seed = seed
        self.policy_version = 0
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_ids: set[int] = {int(e) for e in (eos if isinstance(eos, list) else [eos])}
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.eos_ids))
        self.max_positions = int(
            getattr(self.model.config, "max_position_embeddings", 0) or 1 << 30
        )
        # transformers 5.2x renamed ``past_key_values`` to ``cache`` (the old name warns).
        forward = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward else "past_key_values"
        self._lock = threading.Lock()
        self._threads_before = torch.get_num_threads()
        self._compute_thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="vfops-hf-generate", initializer=_split_cpu_threads
        )
        self.run_compute: ComputeRunner = self._in_compute_thread
        """Where the torch work runs; the recipe points it at its training thread when
        generation does not overlap training (see ``MainThreadCompute``)."""
        self._client = HFGenerationClient(self)

    @property
    def client(self) -> ModelClient:
        return self._client

    @property
    def prefix_breaks(self) -> int:
        return self._client.prefix_breaks

    async def sync_weights(self, model: Any, policy_version: int) -> float:
        started = time.perf_counter()
        state = full_state_dict(model)
        await self.run_compute(self._load, state, policy_version)
        return time.perf_counter() - started

    async def aclose(self) -> None:
        await self._client.aclose()
        self._compute_thread.shutdown(wait=False)
        # undo _split_cpu_threads: the thread count is process-wide
        self._torch.set_num_threads(self._threads_before)

    async def _in_compute_thread(self, fn: Callable[..., _T], *args: Any) -> _T:
        # Always the same OS thread: every thread that runs torch ops gets its own
        # OpenMP team, and two teams on few cores slow each other down.
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._compute_thread, functools.partial(fn, *args))

    def _load(self, state: dict[str, Any], policy_version: int) -> None:
        with self._lock, self._torch.no_grad():
            own = self.model.state_dict()
            for name, tensor in state.items():
                if name in own:
                    own[name].copy_(tensor)
            self.policy_version = policy_version

    def sample(self, batch: list[_Request]) -> list[_Sampled]:
        """Sample completions for ``batch`` (worker thread); one forward per new token."""
        torch = self._torch
        width = max(len(r.prompt_ids) for r in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, req in enumerate(batch):  # left padding
            input_ids[row, width - len(req.prompt_ids) :] = torch.tensor(req.prompt_ids)
            attention[row, width - len(req.prompt_ids) :] = 1
        device = next(self.model.parameters()).device
        input_ids, attention = input_ids.to(device), attention.to(device)
        generators = [torch.Generator(device=device).manual_seed(r.seed) for r in batch]
        results = [_Sampled() for _ in batch]
        active = list(range(len(batch)))
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        with self._lock, torch.inference_mode():
            version = self.policy_version
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
            )
            # greedy rows (held-out eval) report logprobs at T=1
            temps = torch.tensor(
                [r.temperature if r.temperature > 0 else 1.0 for r in batch], device=device
            ).unsqueeze(1)
            greedy = torch.tensor([r.temperature <= 0 for r in batch], device=device)
            for step in range(max(r.max_new_tokens for r in batch)):
                logprobs = torch.log_softmax(out.logits[:, -1, :].float() / temps, dim=-1)
                # One uniform draw per row from that row's own generator, then inverse-CDF
                # sampling of the whole batch at once: a row's tokens depend only on its
                # seed (not on what else is in the batch), at batch speed.
                uniform = torch.zeros(len(batch), 1, device=device)
                for row in active:
                    if not batch[row].temperature <= 0:
                        uniform[row, 0] = torch.rand(1, generator=generators[row], device=device)
                cdf = logprobs.exp().cumsum(-1)
                drawn = (cdf < uniform * cdf[:, -1:]).sum(-1).clamp(max=cdf.shape[-1] - 1)
                tokens = torch.where(greedy, logprobs.argmax(-1), drawn)
                chosen = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
                token_list, chosen_list = tokens.tolist(), chosen.tolist()
                next_ids = torch.full((len(batch), 1), self.pad_id, dtype=torch.long, device=device)
                for row in active:
                    res, token = results[row], int(token_list[row])
                    res.token_ids.append(token)
                    res.logprobs.append(float(chosen_list[row]))
                    next_ids[row, 0] = token
                    res.hit_eos = token in self.eos_ids
                active = [
                    row
                    for row in active
                    if not results[row].hit_eos and step + 1 < batch[row].max_new_tokens
                ]
                if not active:
                    break
                ones = torch.ones((len(batch), 1), dtype=torch.long, device=device)
                attention = torch.cat([attention, ones], 1)
                positions = positions[:, -1:] + 1
                out = self.model(
                    input_ids=next_ids,
                    attention_mask=attention,
                    position_ids=positions,
                    use_cache=True,
                    **{self._cache_arg: _cache_of(out)},
                )
        for res in results:
            res.policy_version = version
        return results


def _split_cpu_threads() -> None:
    """Generation running alongside training (``async_steps > 0``) on a CPU: split the
    cores between the two instead of oversubscribing them.

    torch's intra-op thread count is process-wide, so this halves training's too. It
    also makes runs reproducible here: with both sides on one thread each (2 cores),
    no float reduction is split differently from run to run.
    """
    import os

    import torch

    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))


def _base_model(model: Any) -> Any:
    """The plain transformers model to copy (peft adapters are merged in by sync)."""
    get_base = getattr(model, "get_base_model", None)
    if get_base is None:
        return model
    base = copy.deepcopy(model).merge_and_unload()
    return base


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


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
            raise ValueError(f"the hf training backend does not support {key}={value!r}")
    if "max_completion_tokens" in merged and merged["max_completion_tokens"] is not None:
        merged["max_tokens"] = merged["max_completion_tokens"]
    return {k: v for k, v in merged.items() if v is not None}


def _derive_seed(seed: int, ordinal: int, turn: int) -> int:
    digest = hashlib.sha256(f"{seed}:{ordinal}:{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
