"""An in-process :class:`~vfops.clients.ModelClient` over a local transformers model.

Heavy module (torch/transformers): imported lazily by :mod:`vfops.local`.

Generation is :class:`~vfops.local._batched.BatchedGenerator`'s (the trainer's
``hf`` backend samples through the same one): concurrent ``chat`` calls are
micro-batched on one compute thread, so the event loop stays responsive and
many concurrent rollouts do not thrash the CPU cores.
"""

from __future__ import annotations

import importlib
import random
from pathlib import Path
from typing import Any

from vfops._errors import InvalidArgumentError, MissingExtraError, VfopsError
from vfops._text_parts import text_only
from vfops._types import Messages, SamplingArgs
from vfops.clients import ChatResponse
from vfops.local._batched import (
    BatchedGenerator,
    Sampled,
    Sampling,
    assistant_message,
    derive_seed,
)


class LocalModelClient:
    """Runs a local Hugging Face causal LM in this process (CPU), OpenAI chat semantics.

    ``model_dir`` must be a local directory (``from_pretrained`` with
    ``local_files_only=True``; nothing is downloaded). ``max_new_tokens_default`` caps
    completions when the request sets no ``max_tokens``/``max_completion_tokens``.
    ``seed`` seeds the draws of requests without a ``seed`` of their own
    (reproducible for a fixed sequence of calls). A per-request ``seed`` sampling
    arg makes that request reproducible on its own (it is then generated alone, not
    batched), and gives the same tokens as the trainer's ``hf`` backend with that
    seed (:func:`~vfops.local._batched.derive_seed`).

    Supported sampling args: ``temperature`` (0 = greedy), ``top_p``, ``top_k``,
    ``min_p``, ``repetition_penalty``, ``max_tokens``/``max_completion_tokens``,
    ``seed``, ``stop`` (string or list, cut from the text). ``extra_body`` is merged
    in. ``logprobs=true`` puts each sampled token's log-probability in ``raw["logprobs"]``
    (OpenAI's shape; ``top_logprobs`` is refused); ``n`` > 1 is refused (send n requests:
    concurrent ones share a batch). The ``model`` name is ignored.
    Unset args are neutral (the model's ``generation_config`` is not consulted).
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
        from vfops.local._tiny import quiet_progress

        path = Path(model_dir)
        if not path.is_dir():
            raise VfopsError(
                f"local model directory {str(path)!r} does not exist; "
                "build one with `vfops model build-tiny DIR`"
            )
        if max_new_tokens_default < 1 or max_batch_size < 1:
            raise InvalidArgumentError("max_new_tokens_default and max_batch_size must be >= 1")
        self.model_dir = path
        self.max_new_tokens_default = max_new_tokens_default
        self.max_batch_size = max_batch_size
        self._seeds = random.Random(seed)
        self.tokenizer: Any = tf.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        with quiet_progress():
            self.model: Any = tf.AutoModelForCausalLM.from_pretrained(
                str(path), local_files_only=True, dtype=torch.float32
            )
        self.model.eval()
        # Rows answered as they stop: an eval's rollouts (and its progress) finish one by
        # one instead of a batch at a time.
        self.generator = BatchedGenerator(
            self.model, self.tokenizer, max_batch_size=max_batch_size, resolve_rows_early=True
        )
        self._closed = False

    @property
    def batches_run(self) -> int:
        """How many batches were generated (for tests and throughput stats)."""
        return self.generator.batches_run

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
        sampling, stop, seeded = self._sampling(sampling_args or {})
        prompt_ids = self._encode(messages, tools)
        sampled = await self.generator.generate(prompt_ids, sampling, solo=seeded)
        response = self._response(model, prompt_ids, sampled, stop, tools)
        if _wants_logprobs(sampling_args or {}):
            assert response.raw is not None
            response.raw["logprobs"] = self._logprobs(sampled)
        return response

    async def aclose(self) -> None:
        """Stop accepting requests and wait for queued ones on this loop to finish."""
        self._closed = True
        await self.generator.aclose()

    # ------------------------------------------------------------------ internals

    def _logprobs(self, sampled: Sampled) -> dict[str, Any]:
        """OpenAI's ``choices[0].logprobs``: each sampled token and its log-probability
        (at the sampling temperature, as the sampler drew it and the trainer reads it)."""
        content = []
        for token_id, logprob in zip(sampled.token_ids, sampled.logprobs, strict=True):
            token = str(self.tokenizer.decode([token_id]))
            content.append({"token": token, "logprob": float(logprob),
                            "bytes": list(token.encode()), "top_logprobs": []})  # fmt: skip
        return {"content": content}

    def _encode(self, messages: Messages, tools: list[dict[str, Any]] | None) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            text_only(messages),
            tools=tools or None,
            add_generation_prompt=True,
            tokenize=False,
        )
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return [int(i) for i in ids]

    def _sampling(self, args: SamplingArgs) -> tuple[Sampling, tuple[str, ...], bool]:
        """(the row's settings, stop strings, whether the request set a seed)."""
        merged: dict[str, Any] = dict(args)
        extra = merged.pop("extra_body", None)
        if isinstance(extra, dict):
            merged.update(extra)
        n = merged.get("n")
        if n is not None and int(n) != 1:
            raise InvalidArgumentError(
                "LocalModelClient answers one choice a request (n=1); send n requests "
                "(concurrent ones are generated in one batch)"
            )
        top = merged.get("top_logprobs")
        if top is not None and int(top) != 0:
            raise InvalidArgumentError(
                "LocalModelClient gives each sampled token's logprob (logprobs=true), not "
                "the top alternatives: drop top_logprobs"
            )
        cap = merged.get("max_completion_tokens")
        if cap is None:
            cap = merged.get("max_tokens")
        max_new = self.max_new_tokens_default if cap is None else int(cap)
        if max_new < 1:
            raise InvalidArgumentError("max_tokens must be >= 1")
        seed = merged.get("seed")
        stop = merged.get("stop")
        stops: tuple[str, ...] = (
            () if not stop else (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop)
        )
        sampling = Sampling(
            max_new_tokens=max_new,
            seed=self._seeds.getrandbits(63) if seed is None else derive_seed(int(seed)),
            temperature=max(0.0, _number(merged, "temperature", 1.0)),
            top_p=_number(merged, "top_p", 1.0),
            top_k=max(0, int(_number(merged, "top_k", 0))),
            min_p=_number(merged, "min_p", 0.0),
            repetition_penalty=_number(merged, "repetition_penalty", 1.0),
        )
        return sampling, stops, seed is not None

    def _response(
        self,
        model: str,
        prompt_ids: list[int],
        sampled: Sampled,
        stop: tuple[str, ...],
        tools: list[dict[str, Any]] | None,
    ) -> ChatResponse:
        text = str(self.tokenizer.decode(sampled.token_ids, skip_special_tokens=True))
        truncated = not sampled.hit_eos
        for s in stop:
            cut = text.find(s)
            if cut >= 0:
                text, truncated = text[:cut], False
        message, finish = assistant_message(text, tools, truncated=truncated)
        return ChatResponse(
            message=message,
            finish_reason=finish,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(sampled.token_ids),
            raw={
                "model": model,
                "model_dir": str(self.model_dir),
                "completion_ids": sampled.token_ids,
                "batch_size": sampled.batch_size,
            },
        )


def _wants_logprobs(args: SamplingArgs) -> bool:
    extra = args.get("extra_body")
    if isinstance(extra, dict) and extra.get("logprobs"):
        return True
    return bool(args.get("logprobs"))


def _number(args: dict[str, Any], key: str, default: float) -> float:
    value = args.get(key)
    return default if value is None else float(value)
