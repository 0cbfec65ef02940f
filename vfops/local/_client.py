"""An in-process :class:`~vfops.clients.ModelClient` over a local transformers model.

Heavy module (torch/transformers): imported lazily by :mod:`vfops.local`.

Generation runs in a worker thread (``asyncio.to_thread``) so the event loop stays
responsive. Concurrent ``chat`` calls are micro-batched: requests that arrive while a
batch is generating queue up, and the next batch takes every queued request with the
same generation settings (left-padded), up to ``max_batch_size``. Only one batch
generates at a time, so many concurrent rollouts do not thrash the CPU cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vfops._errors import MissingExtraError, VfopsError
from vfops._types import Message, Messages, SamplingArgs
from vfops.clients._base import ChatResponse, PromptTooLongError

_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)

# Sampling args that only make sense for an HTTP server, or that this client ignores.
_IGNORED_ARGS = frozenset(
    {
        "n",
        "logprobs",
        "top_logprobs",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "user",
        "stream",
        "stream_options",
        "response_format",
        "parallel_tool_calls",
        "tool_choice",
        "timeout",
        "extra_headers",
        "extra_query",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "return_tokens_as_token_ids",
        "chat_template_kwargs",
    }
)


@dataclass(frozen=True, slots=True)
class _GenKey:
    """The generation settings a batch must share."""

    do_sample: bool
    temperature: float
    top_p: float
    top_k: int
    min_p: float | None
    repetition_penalty: float
    max_new_tokens: int
    seed: int | None


@dataclass(slots=True)
class _Request:
    prompt_ids: list[int]
    key: _GenKey
    stop: tuple[str, ...]
    future: asyncio.Future[_Result]


@dataclass(slots=True)
class _Result:
    token_ids: list[int]
    hit_eos: bool
    prompt_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)


class LocalModelClient:
    """Runs a local Hugging Face causal LM in this process (CPU), OpenAI chat semantics.

    ``model_dir`` must be a local directory (``from_pretrained`` with
    ``local_files_only=True``; nothing is downloaded). ``max_new_tokens_default`` caps
    completions when the request sets no ``max_tokens``/``max_completion_tokens``.
    ``seed`` seeds torch once at load time (reproducible for a fixed sequence of
    calls); a per-request ``seed`` sampling arg makes that request reproducible on
    its own (it is then generated alone, not batched).

    Supported sampling args: ``temperature`` (0 = greedy), ``top_p``, ``top_k``,
    ``min_p``, ``repetition_penalty``, ``max_tokens``/``max_completion_tokens``,
    ``seed``, ``stop`` (string or list, cut from the text). ``extra_body`` is merged
    in. ``n`` > 1 and ``logprobs`` are not supported. The ``model`` name is ignored.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        max_new_tokens_default: int = 64,
        seed: int | None = None,
        max_batch_size: int = 16,
    ) -> None:
        try:
            import torch

            tf: Any = importlib.import_module("transformers")
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingExtraError("train", exc.name or "torch") from exc
        from vfops.local._tiny import _quiet_progress

        path = Path(model_dir)
        if not path.is_dir():
            raise VfopsError(
                f"local model directory {str(path)!r} does not exist; "
                "build one with `vfops model build-tiny DIR`"
            )
        if max_new_tokens_default < 1 or max_batch_size < 1:
            raise ValueError("max_new_tokens_default and max_batch_size must be >= 1")
        self.model_dir = path
        self.max_new_tokens_default = max_new_tokens_default
        self.max_batch_size = max_batch_size
        self._torch = torch
        if seed is not None:
            torch.manual_seed(seed)
        self.tokenizer: Any = tf.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.tokenizer.padding_side = "left"
        with _quiet_progress():
            self.model: Any = tf.AutoModelForCausalLM.from_pretrained(
                str(path), local_files_only=True, dtype=torch.float32
            )
        self.model.eval()
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tokenizer.eos_token_id
        self._eos_ids: list[int] = [int(e) for e in (eos if isinstance(eos, list) else [eos])]
        pad = self.tokenizer.pad_token_id
        self._pad_id: int = int(pad if pad is not None else self._eos_ids[0])
        self._max_positions: int = int(
            getattr(self.model.config, "max_position_embeddings", 0) or 1 << 30
        )
        self._queue: list[_Request] = []
        self._drainer: asyncio.Task[None] | None = None
        self._generate_lock = threading.Lock()
        self._closed = False
        self.batches_run = 0
        """How many ``generate`` calls ran (for tests and throughput stats)."""

    # ------------------------------------------------------------------ public API

    async def chat(
        self,
        *,
        model: str,
        messages: Messages,
        sampling_args: SamplingArgs | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatResponse:
        if self._closed:
            raise RuntimeError("LocalModelClient is closed")
        key, stop = self._gen_key(sampling_args or {})
        prompt_ids = self._encode(messages, tools)
        room = self._max_positions - len(prompt_ids)
        if room < 1:
            raise PromptTooLongError(
                f"prompt has {len(prompt_ids)} tokens; the model's context is "
                f"{self._max_positions} tokens"
            )
        if key.max_new_tokens > room:
            key = _replace_max_new(key, room)
        loop = asyncio.get_running_loop()
        request = _Request(prompt_ids, key, stop, loop.create_future())
        self._queue.append(request)
        self._ensure_drainer(loop)
        result = await request.future
        return self._response(model, request, result, tools)

    async def aclose(self) -> None:
        """Stop accepting requests and wait for queued ones on this loop to finish."""
        self._closed = True
        drainer = self._drainer
        if (
            drainer is not None
            and not drainer.done()
            and drainer.get_loop() is asyncio.get_running_loop()
        ):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(drainer)
        self._drainer = None

    # ------------------------------------------------------------------ internals

    def _encode(self, messages: Messages, tools: list[dict[str, Any]] | None) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=tools or None,
            add_generation_prompt=True,
            tokenize=False,
        )
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return [int(i) for i in ids]

    def _gen_key(self, args: SamplingArgs) -> tuple[_GenKey, tuple[str, ...]]:
        merged: dict[str, Any] = dict(args)
        extra = merged.pop("extra_body", None)
        if isinstance(extra, dict):
            merged.update(extra)
        n = merged.get("n")
        if n is not None and int(n) != 1:
            raise ValueError("LocalModelClient supports only n=1")
        cap = merged.get("max_completion_tokens")
        if cap is None:
            cap = merged.get("max_tokens")
        max_new = self.max_new_tokens_default if cap is None else int(cap)
        if max_new < 1:
            raise ValueError("max_tokens must be >= 1")
        temperature = merged.get("temperature")
        temperature = 1.0 if temperature is None else float(temperature)
        do_sample = temperature > 0.0
        top_p = merged.get("top_p")
        top_k = merged.get("top_k")
        min_p = merged.get("min_p")
        rep = merged.get("repetition_penalty")
        seed = merged.get("seed")
        stop = merged.get("stop")
        stops: tuple[str, ...] = (
            () if not stop else (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop)
        )
        key = _GenKey(
            do_sample=do_sample,
            temperature=temperature if do_sample else 1.0,
            top_p=1.0 if top_p is None or not do_sample else float(top_p),
            top_k=0 if top_k is None or not do_sample or int(top_k) < 0 else int(top_k),
            min_p=None if min_p is None or not do_sample or not float(min_p) else float(min_p),
            repetition_penalty=1.0 if rep is None else float(rep),
            max_new_tokens=max_new,
            seed=None if seed is None else int(seed),
        )
        return key, stops

    def _ensure_drainer(self, loop: asyncio.AbstractEventLoop) -> None:
        drainer = self._drainer
        if drainer is not None and not drainer.done() and not drainer.get_loop().is_closed():
            return
        self._drainer = loop.create_task(self._drain())

    async def _drain(self) -> None:
        """Generate queued requests batch by batch until the queue is empty."""
        try:
            while self._queue:
                batch = self._take_batch()
                if not batch:
                    continue
                try:
                    results = await asyncio.to_thread(self._generate, batch)
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

    def _take_batch(self) -> list[_Request]:
        # Drop requests whose caller gave up (cancelled) before they were generated.
        self._queue = [r for r in self._queue if not r.future.done()]
        if not self._queue:
            return []
        first = self._queue[0]
        limit = 1 if first.key.seed is not None else self.max_batch_size
        batch = [r for r in self._queue if r.key == first.key][:limit]
        taken = {id(r) for r in batch}
        self._queue = [r for r in self._queue if id(r) not in taken]
        return batch

    def _generate(self, batch: list[_Request]) -> list[_Result]:
        """Run one ``model.generate`` (worker thread)."""
        torch = self._torch
        key = batch[0].key
        width = max(len(r.prompt_ids) for r in batch)
        input_ids = torch.full((len(batch), width), self._pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, req in enumerate(batch):  # left padding
            n = len(req.prompt_ids)
            input_ids[row, width - n :] = torch.tensor(req.prompt_ids, dtype=torch.long)
            attention_mask[row, width - n :] = 1
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "max_new_tokens": key.max_new_tokens,
            "do_sample": key.do_sample,
            "eos_token_id": self._eos_ids,
            "pad_token_id": self._pad_id,
        }
        if key.repetition_penalty != 1.0:
            kwargs["repetition_penalty"] = key.repetition_penalty
        if key.do_sample:  # sampling-only flags: passing them when greedy warns
            kwargs.update(temperature=key.temperature, top_p=key.top_p, top_k=key.top_k)
            if key.min_p is not None:
                kwargs["min_p"] = key.min_p
        with self._generate_lock, torch.inference_mode():
            if key.seed is not None:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(key.seed)
                    out = self.model.generate(**kwargs)
            else:
                out = self.model.generate(**kwargs)
            self.batches_run += 1
        results: list[_Result] = []
        eos = set(self._eos_ids)
        for row, req in enumerate(batch):
            new = [int(t) for t in out[row, width:].tolist()]
            hit_eos = False
            for i, tok in enumerate(new):
                if tok in eos:
                    new = new[: i + 1]
                    hit_eos = True
                    break
            results.append(
                _Result(
                    new,
                    hit_eos,
                    len(req.prompt_ids),
                    {"batch_size": len(batch)},
                )
            )
        return results

    def _response(
        self,
        model: str,
        request: _Request,
        result: _Result,
        tools: list[dict[str, Any]] | None,
    ) -> ChatResponse:
        text = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        finish = "stop" if result.hit_eos else "length"
        for s in request.stop:
            cut = text.find(s)
            if cut >= 0:
                text = text[:cut]
                finish = "stop"
        message: Message = {"role": "assistant", "content": text}
        if tools:
            calls = _parse_tool_calls(text)
            if calls:
                message["tool_calls"] = calls
                first = _TOOL_CALL_RE.search(text)
                message["content"] = text[: first.start()].rstrip() if first else text
                finish = "tool_calls"
        return ChatResponse(
            message=message,
            finish_reason=finish,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=len(result.token_ids),
            raw={
                "model": model,
                "model_dir": str(self.model_dir),
                "completion_ids": result.token_ids,
                **result.extra,
            },
        )


def _replace_max_new(key: _GenKey, max_new: int) -> _GenKey:
    return _GenKey(
        do_sample=key.do_sample,
        temperature=key.temperature,
        top_p=key.top_p,
        top_k=key.top_k,
        min_p=key.min_p,
        repetition_penalty=key.repetition_penalty,
        max_new_tokens=max_new,
        seed=key.seed,
    )


def _resolve(
    future: asyncio.Future[_Result],
    *,
    result: _Result | None = None,
    exc: BaseException | None = None,
) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    elif result is not None:
        future.set_result(result)


def _parse_tool_calls(text: str) -> list[dict[str, Any]]:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks -> OpenAI tool calls."""
    calls: list[dict[str, Any]] = []
    for match in _TOOL_CALL_RE.finditer(text):
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
