"""The one batched in-process generator: :class:`LocalModelClient` and the trainer's
``hf`` backend both sample through :class:`BatchedGenerator`.

Importing this module loads no torch (``vfops.training._vllm`` uses the tool-call
helpers here); torch is imported when a generator is built.

Concurrent ``generate`` calls queue up; one drainer task per event loop cuts
batches (left-padded, up to ``max_batch_size``) and runs the token loop on one
compute thread, one batch at a time, so many concurrent rollouts do not thrash
the cores. Every row carries its own sampling settings, so requests with
different temperatures, caps or truncation share a batch.

With ``resolve_rows_early`` (the local client) a row's caller gets its answer as soon
as that row stops (end-of-sequence or its cap), not when the whole batch is done, so
an eval's rollouts finish (and its progress moves) one by one. The trainer's backend
keeps it off: there every row of a batch is answered at the batch's end, in batch
order, so which rollouts share the next batch never depends on how the compute
thread and the event loop happened to interleave (see ``_settle``).

Sampling is a hand-written loop (not ``model.generate``) because training needs
the exact log-probability of each sampled token under the processed (tempered,
truncated) distribution, and reproducible draws: each row samples from its own
``torch.Generator`` seeded with the request's ``seed``, so its tokens do not
depend on which requests happened to share its batch (up to the float rounding
that padding can change; see ``_settle``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import hashlib
import inspect
import json
import re
import threading
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from vfops._types import Message
from vfops.clients import PromptTooLongError

_T = TypeVar("_T")

ComputeRunner = Callable[..., Awaitable[Any]]
"""``await run(fn, *args)``: run blocking torch work ``fn(*args)`` somewhere, return its result."""

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Sampling:
    """One row's sampling settings (Hugging Face semantics; neutral by default).

    ``temperature`` 0 is greedy (its logprobs are then reported at T=1).
    ``seed`` seeds the row's own ``torch.Generator``.
    """

    max_new_tokens: int
    seed: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def truncates(self) -> bool:
        """Whether this row's distribution is cut (top-k/top-p/min-p) before sampling."""
        return not self.greedy and (self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0)


@dataclass(slots=True)
class Sampled:
    """What one row produced: token ids, their logprobs, and the weights' version."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    hit_eos: bool = False
    version: int = 0
    batch_size: int = 0


@dataclass(slots=True)
class _Request:
    prompt_ids: list[int]
    sampling: Sampling
    solo: bool
    future: asyncio.Future[Sampled]


def derive_seed(seed: int, conversation: int = 0, turn: int = 0) -> int:
    """The row seed of turn ``turn`` of the ``conversation``-th conversation asking with
    ``seed``: a request's ``seed`` alone (conversation 0, turn 0) means the same
    draws in :class:`LocalModelClient` and in the trainer's first rollout."""
    digest = hashlib.sha256(f"{seed}:{conversation}:{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class BatchedGenerator:
    """Micro-batched sampling from a Hugging Face causal LM; see the module docstring.

    ``split_cpu_threads``: the compute thread halves torch's (process-wide) thread
    count on a CPU, for generation that runs alongside training (restored by
    :meth:`aclose`). ``resolve_rows_early``: answer each row when it stops instead of
    at the end of its batch (see the module docstring). ``run_compute`` is where the
    torch work runs (default: one dedicated thread); the trainer points it at its
    training thread when generation does not overlap training. ``sample_batch`` is the
    token loop (replaceable, e.g. to time it).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int,
        split_cpu_threads: bool = False,
        resolve_rows_early: bool = False,
    ) -> None:
        import torch

        self._torch = torch
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_ids: list[int] = [int(e) for e in (eos if isinstance(eos, list) else [eos])]
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_ids[0])
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        # transformers 5.2x renamed ``past_key_values`` to ``cache`` (the old name warns).
        forward = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward else "past_key_values"
        self.lock = threading.Lock()
        """Held while sampling; hold it to change the weights between batches."""
        self.version = 0
        """The weights' version, reported with each row (the trainer's policy version)."""
        self.batches_run = 0
        """Batches started."""
        self._split_threads = split_cpu_threads
        self.resolve_rows_early = resolve_rows_early
        self._threads_before = torch.get_num_threads()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._queue: list[_Request] = []
        self._drainer: asyncio.Task[None] | None = None
        self.run_compute: ComputeRunner = self._in_compute_thread
        self.sample_batch: Callable[[list[_Request]], list[Sampled]] = self.sample

    # ------------------------------------------------------------------ requests

    def room(self, prompt_ids: list[int]) -> int:
        """Tokens the model can still generate after ``prompt_ids`` (at least 1)."""
        room = self.max_positions - len(prompt_ids)
        if room < 1:
            raise PromptTooLongError(
                f"prompt has {len(prompt_ids)} tokens; the model's context is "
                f"{self.max_positions} tokens"
            )
        return room

    async def generate(
        self, prompt_ids: list[int], sampling: Sampling, *, solo: bool = False
    ) -> Sampled:
        """Sample one completion of ``prompt_ids``; ``max_new_tokens`` is capped to the
        context left. ``solo``: generate it in a batch of its own (no padding, so its
        tokens are exactly reproducible from its seed)."""
        room = self.room(prompt_ids)
        if sampling.max_new_tokens > room:
            sampling = _with_cap(sampling, room)
        loop = asyncio.get_running_loop()
        request = _Request(prompt_ids, sampling, solo, loop.create_future())
        self._queue.append(request)
        self._ensure_drainer(loop)
        return await request.future

    async def aclose(self) -> None:
        """Wait for the requests queued on this loop; stop the compute thread."""
        drainer = self._drainer
        if (
            drainer is not None
            and not drainer.done()
            and drainer.get_loop() is asyncio.get_running_loop()
        ):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(drainer)
        self._drainer = None
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
        if self._split_threads:  # the thread count is process-wide: undo the split
            self._torch.set_num_threads(self._threads_before)

    def load_state(self, state: dict[str, Any], version: int) -> None:
        """Copy ``state``'s tensors into the model (between batches); set :attr:`version`."""
        with self.lock, self._torch.no_grad():
            own = self.model.state_dict()
            for name, tensor in state.items():
                if name in own:
                    own[name].copy_(tensor)
            self.version = version

    # ------------------------------------------------------------------ batching

    def _ensure_drainer(self, loop: asyncio.AbstractEventLoop) -> None:
        drainer = self._drainer
        if drainer is not None and not drainer.done() and not drainer.get_loop().is_closed():
            return
        self._drainer = loop.create_task(self._drain())

    async def _drain(self) -> None:
        """Generate queued requests batch by batch until the queue is empty."""
        try:
            while self._queue:
                await self._settle()
                batch = self._take_batch()
                if not batch:
                    continue
                try:
                    results = await self.run_compute(self.sample_batch, batch)
                except Exception as exc:
                    for req in batch:
                        _resolve(req.future, exc=exc)
                    continue
                except BaseException:
                    for req in batch:
                        req.future.cancel()
                    raise
                for req, res in zip(batch, results, strict=True):
                    _resolve(req.future, result=res)
        except BaseException:
            # Cancelled (e.g. the event loop is shutting down): nobody will serve the
            # queue, so cancel the waiters that belong to this loop.
            loop = asyncio.get_running_loop()
            for req in self._queue:
                if req.future.get_loop() is loop:
                    req.future.cancel()
            self._queue = [r for r in self._queue if not r.future.done()]
            raise

    async def _settle(self) -> None:
        """Let every caller that is ready to ask queue its request before a batch is cut.

        A batch's padding changes the float rounding of the logits, so its composition
        must not depend on thread timing: then runs (and a resumed training run) are
        reproducible. Callers waiting on real I/O still join whichever batch is next.
        """
        seen = -1
        while len(self._queue) != seen:
            seen = len(self._queue)
            for _ in range(4):
                await asyncio.sleep(0)

    def _take_batch(self) -> list[_Request]:
        # Drop requests whose caller gave up (cancelled) before they were generated.
        self._queue = [r for r in self._queue if not r.future.done()]
        if not self._queue:
            return []
        if self._queue[0].solo:
            batch = self._queue[:1]
        else:
            batch = [r for r in self._queue if not r.solo][: self.max_batch_size]
        taken = {id(r) for r in batch}
        self._queue = [r for r in self._queue if id(r) not in taken]
        return batch

    def _compute_thread(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix="vfops-generate",
                initializer=_split_cpu_threads if self._split_threads else None,
            )
        return self._executor

    async def _in_compute_thread(self, fn: Callable[..., _T], *args: Any) -> _T:
        # Always the same OS thread: every thread that runs torch ops gets its own
        # OpenMP team, and two teams on few cores slow each other down.
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._compute_thread(), functools.partial(fn, *args))

    # ------------------------------------------------------------------ the token loop

    def sample(self, batch: list[_Request]) -> list[Sampled]:
        """Sample completions for ``batch`` (compute thread); one forward per new token."""
        # counted as it starts: with rows resolved early, a caller may see every row of
        # the batch answered before the loop below has ended
        self.batches_run += 1
        torch = self._torch
        rows = [r.sampling for r in batch]
        width = max(len(r.prompt_ids) for r in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, req in enumerate(batch):  # left padding
            input_ids[row, width - len(req.prompt_ids) :] = torch.tensor(req.prompt_ids)
            attention[row, width - len(req.prompt_ids) :] = 1
        device = next(self.model.parameters()).device
        input_ids, attention = input_ids.to(device), attention.to(device)
        generators = [torch.Generator(device=device).manual_seed(s.seed) for s in rows]
        results = [Sampled(batch_size=len(batch)) for _ in batch]
        active = list(range(len(batch)))
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        eos = set(self.eos_ids)
        with self.lock, torch.inference_mode():
            for res in results:  # before any row is handed back early
                res.version = self.version
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
            )
            process = _Processor(torch, rows, batch, device)
            greedy = torch.tensor([s.greedy for s in rows], device=device)
            for step in range(max(s.max_new_tokens for s in rows)):
                logprobs = process(out.logits[:, -1, :])
                # One uniform draw per row from that row's own generator, then inverse-CDF
                # sampling of the whole batch at once: a row's tokens depend only on its
                # seed (not on what else is in the batch), at batch speed.
                uniform = torch.zeros(len(batch), 1, device=device)
                for row in active:
                    if not rows[row].greedy:
                        uniform[row, 0] = torch.rand(1, generator=generators[row], device=device)
                # (a zero draw would pick token 0 even when top-k/top-p removed it)
                uniform.clamp_(min=1e-12)
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
                    res.hit_eos = token in eos
                process.saw(tokens)
                still_active = []
                for row in active:
                    if not results[row].hit_eos and step + 1 < rows[row].max_new_tokens:
                        still_active.append(row)
                    elif self.resolve_rows_early:
                        _resolve_from_thread(batch[row].future, results[row])
                active = still_active
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
        return results


class _Processor:
    """Logits -> the log-probabilities each row samples from, in Hugging Face's order:
    repetition penalty, temperature, top-k, top-p, min-p.

    Each step only pays for what some row of the batch uses: with plain tempered
    sampling (the trainer) it is one ``log_softmax``.
    """

    def __init__(self, torch: Any, rows: list[Sampling], batch: list[_Request], device: Any):
        self._torch = torch
        self._temps = torch.tensor(
            [s.temperature if not s.greedy else 1.0 for s in rows], device=device
        ).unsqueeze(1)
        self._penalties: Any = None
        self._seen: Any = None
        self._prompts = [r.prompt_ids for r in batch]
        if any(s.repetition_penalty != 1.0 for s in rows):
            self._penalties = torch.tensor(
                [s.repetition_penalty for s in rows], device=device
            ).unsqueeze(1)
        self._truncating = any(s.truncates for s in rows)
        if self._truncating:
            # per-row cut-offs, neutral where a row does not truncate (greedy ignores them)
            cuts = [(s.top_k, s.top_p, s.min_p) if s.truncates else (0, 1.0, 0.0) for s in rows]
            self._top_k = [k for k, _, _ in cuts]
            self._top_p = torch.tensor([p for _, p, _ in cuts], device=device).unsqueeze(1)
            self._min_p = torch.tensor([m for _, _, m in cuts], device=device).unsqueeze(1)

    def __call__(self, logits: Any) -> Any:
        torch = self._torch
        scores = logits.float()
        if self._penalties is not None:
            scores = self._penalise(scores)
        scores = scores / self._temps
        if self._truncating:
            scores = self._truncate(scores)
        return torch.log_softmax(scores, dim=-1)

    def saw(self, tokens: Any) -> None:
        """Record each row's new token (for the repetition penalty)."""
        if self._seen is not None:
            self._seen.scatter_(1, tokens.unsqueeze(1), True)

    def _penalise(self, scores: Any) -> Any:
        torch = self._torch
        if self._seen is None:
            self._seen = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
            for row, ids in enumerate(self._prompts):
                self._seen[row, torch.tensor(ids, device=scores.device)] = True
        penalised = torch.where(scores > 0, scores / self._penalties, scores * self._penalties)
        return torch.where(self._seen, penalised, scores)

    def _truncate(self, scores: Any) -> Any:
        """Top-k, then top-p, then min-p (transformers' warpers), all rows at once; the
        best token of a row is never cut."""
        torch = self._torch
        vocab = scores.shape[-1]
        removed = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
        ks = [k if 0 < k < vocab else 0 for k in self._top_k]
        if any(ks):
            index = torch.tensor([[max(k, 1) - 1] for k in ks], device=scores.device)
            kth = torch.topk(scores, max(ks)).values.gather(1, index)
            limited = torch.tensor([k > 0 for k in ks], device=scores.device).unsqueeze(1)
            removed |= limited & (scores < kth)
        if bool((self._top_p < 1.0).any()):
            ordered, order = torch.sort(scores.masked_fill(removed, float("-inf")))  # ascending
            cut = ordered.softmax(-1).cumsum(-1) <= (1 - self._top_p)
            cut[:, -1] = False
            removed |= torch.zeros_like(removed).scatter(1, order, cut)
        if bool((self._min_p > 0.0).any()):
            probs = scores.masked_fill(removed, float("-inf")).softmax(-1)
            removed |= probs < self._min_p * probs.amax(-1, keepdim=True)
        return scores.masked_fill(removed, float("-inf"))


def _with_cap(sampling: Sampling, max_new_tokens: int) -> Sampling:
    return Sampling(
        max_new_tokens=max_new_tokens,
        seed=sampling.seed,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        min_p=sampling.min_p,
        repetition_penalty=sampling.repetition_penalty,
    )


def _resolve(
    future: asyncio.Future[Sampled],
    *,
    result: Sampled | None = None,
    exc: BaseException | None = None,
) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    elif result is not None:
        future.set_result(result)


def _resolve_from_thread(future: asyncio.Future[Sampled], result: Sampled) -> None:
    """Answer ``future`` with ``result`` from the compute thread (its row has stopped and
    is never written again); the drainer's later :func:`_resolve` of it is a no-op."""
    loop = future.get_loop()
    with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
        loop.call_soon_threadsafe(functools.partial(_resolve, future, result=result))


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


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


# --------------------------------------------------------------------------- replies


def assistant_message(
    text: str, tools: list[dict[str, Any]] | None, *, truncated: bool
) -> tuple[Message, str]:
    """The assistant message for sampled ``text`` and its OpenAI finish reason.

    With tools, ``<tool_call>{...}</tool_call>`` blocks become ``tool_calls`` and the
    content is the text before the first one. A completion cut at the token cap is
    ``"length"`` even when it holds a complete call (as OpenAI reports it), so a
    truncated turn is never mistaken for a finished one.
    """
    message: Message = {"role": "assistant", "content": text}
    finish = "length" if truncated else "stop"
    if tools:
        calls = parse_tool_calls(text)
        if calls:
            message["tool_calls"] = calls
            first = TOOL_CALL_RE.search(text)
            message["content"] = text[: first.start()].rstrip() if first else text
            finish = finish if truncated else "tool_calls"
    return message, finish


def parse_tool_calls(text: str) -> list[dict[str, Any]]:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks -> OpenAI tool calls."""
    calls: list[dict[str, Any]] = []
    for match in TOOL_CALL_RE.finditer(text):
        try:
            data = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            continue
        args = data.get("arguments", {})
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": data["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    return calls
