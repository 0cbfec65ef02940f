"""Generation through a vLLM server: token-in/token-out turns and weight sync.

:class:`VLLMBackend` implements :class:`~vfops.training._backend.GenerationBackend`
against a vLLM OpenAI-compatible server started by ``vfops vllm serve`` (see
``vfops/training/VLLM.md``).

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

Weight sync, after each optimizer step:

- ``filesystem``: the model is saved as safetensors (+ config) under ``sync_dir``,
  the server reloads in place through ``POST /collective_rpc`` with vLLM's own
  ``vfops_load_weights(weights_path=...)`` (vfops' worker extension,
  :mod:`vfops.training._vllm_worker`; dev-mode endpoint), then ``POST
  /reset_prefix_cache``. Works on the CPU build of vLLM too.
- ``nccl``: vLLM's native weight-transfer API (server started with
  ``--weight-transfer-config '{"backend": "nccl"}'``): once, ``/init_weight_transfer_engine``
  while this process joins the NCCL group as rank 0; each sync,
  ``/start_weight_update``, ``/update_weights`` (names, dtypes, shapes) while every
  parameter is broadcast, ``/finish_weight_update``, ``/reset_prefix_cache``.
  Needs ``vllm`` importable in the trainer's Python and a CUDA device.

Heavy imports (torch, safetensors, vllm) happen inside functions only.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson
from pydantic import ConfigDict, Field

from vfops._errors import VfopsError
from vfops._types import Message, Messages, SamplingArgs
from vfops.clients._base import ChatResponse, PromptTooLongError
from vfops.clients._errors import APIConnectionError, APIStatusError, MalformedResponseError
from vfops.clients._http import HTTPTransport
from vfops.clients._openai import is_context_error
from vfops.clients._retry import RetryPolicy
from vfops.training._backend import TOKENS_KEY, TurnTokens
from vfops.training._config import VLLMServerSettings
from vfops.training._continuation import (
    PROMPT_SOURCE_KEY,
    PromptSource,
    TokenMode,
    Turn,
    TurnMemory,
)

if TYPE_CHECKING:
    import torch

    from vfops.clients import ModelClient

log = logging.getLogger("vfops.training.vllm")


class VLLMBackendError(VfopsError):
    """The vLLM server is unreachable, misconfigured, or refused a request."""


class VLLMGenerationConfig(VLLMServerSettings):
    """How the trainer reaches a vLLM server and syncs weights into it: ``[generation]``'s
    server fields (same names, defaults and checks) plus the client's own settings."""

    model_config = ConfigDict(frozen=True)

    model: str | None = Field(
        default=None, description="Served model name; default: the first one /v1/models lists."
    )
    timeout_s: float = Field(
        default=600.0, gt=0, description="Seconds one generation request may take."
    )
    max_retries: int = Field(
        default=3, ge=0, description="Retries of a generation request on 429/5xx/connection errors."
    )
    sync_timeout_s: float = Field(
        default=600.0, gt=0, description="Seconds one weight-sync request may take."
    )
    nccl_master_address: str = Field(
        default="127.0.0.1",
        description="nccl sync: address of this (trainer) host that the server can reach.",
    )
    nccl_master_port: int = Field(
        default=0, ge=0, le=65535, description="nccl sync: rendezvous port; 0 picks a free one."
    )
    prompt_cache_size: int = Field(
        default=8192,
        ge=1,
        description=(
            "Conversations remembered for multi-turn token continuation (LRU); at "
            "least the number of rollouts in flight."
        ),
    )

    @staticmethod
    def help() -> dict[str, str]:
        """Field name -> help string."""
        return VLLMGenerationConfig.field_help()


# --------------------------------------------------------------------------- HTTP


def _split_base_url(base_url: str) -> tuple[str, str]:
    """(server root, OpenAI API base): vLLM's admin routes live at the root, not /v1."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root, root + "/v1"


def _error_detail(exc: APIStatusError) -> str:
    return exc.message[:300]  # already one line, from vLLM's {"error": {"message": ...}}


class _Server:
    """The HTTP side: generation with retries, admin calls without (they are not
    always idempotent and a failure must surface, not be hidden by a retry)."""

    def __init__(self, config: VLLMGenerationConfig) -> None:
        self.root, self.api = _split_base_url(config.base_url)
        self.retry = RetryPolicy(max_retries=config.max_retries)
        self.sync_timeout_s = config.sync_timeout_s
        api_key = os.environ.get(config.api_key_var) if config.api_key_var else None
        if config.api_key_var and not api_key:
            raise VLLMBackendError(
                f"generation.api_key_var names {config.api_key_var!r}, which is not set; "
                "export it or drop api_key_var"
            )
        self._http = HTTPTransport(
            self.api,
            headers={
                "Authorization": f"Bearer {api_key or 'EMPTY'}",
                "Content-Type": "application/json",
            },
            timeout_s=config.timeout_s,
            max_connections=1024,
        )

    def _unreachable(self, exc: BaseException) -> VLLMBackendError:
        return VLLMBackendError(
            f"cannot reach the vLLM server at {self.root} ({type(exc).__name__}); "
            "start it with `vfops vllm serve MODEL_DIR` or fix generation.base_url"
        )

    async def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        payload = orjson.dumps(body)
        attempt = 0
        while True:
            try:
                content = await self._http.request("POST", self.api + "/completions", payload)
                data: dict[str, Any] = _decode_json(content)
                return data
            except APIStatusError as exc:
                if is_context_error(exc):
                    raise PromptTooLongError(
                        f"prompt too long for the vLLM server: {_error_detail(exc)}"
                    ) from exc
                if attempt >= self.retry.max_retries or not self.retry.is_retryable(exc):
                    raise VLLMBackendError(
                        f"vLLM server at {self.root} refused a completion "
                        f"(HTTP {exc.status_code}: {_error_detail(exc)})"
                    ) from exc
                delay = self.retry.delay_for(attempt, exc.retry_after_s)
            except Exception as exc:
                if attempt >= self.retry.max_retries or not self.retry.is_retryable(exc):
                    if isinstance(exc, APIConnectionError):
                        raise self._unreachable(exc) from exc
                    raise
                delay = self.retry.delay_for(attempt, None)
            log.debug(
                "completion: retry %d/%d in %.2fs", attempt + 1, self.retry.max_retries, delay
            )
            await asyncio.sleep(delay)
            attempt += 1

    async def admin(
        self,
        method: Literal["GET", "POST"],
        path: str,
        body: dict[str, Any] | None = None,
        *,
        what: str,
        fix: str = "check the vLLM server log",
    ) -> Any:
        """Call a root-level admin route; any failure is a one-line VLLMBackendError."""
        url = self.root + path
        payload = None if method == "GET" else orjson.dumps(body if body is not None else {})
        try:
            content = await self._http.request(method, url, payload, timeout_s=self.sync_timeout_s)
        except APIStatusError as exc:
            if exc.status_code == 404:
                fix = (
                    "the server has no such route: start it with `vfops vllm serve` "
                    "(it sets VLLM_SERVER_DEV_MODE=1)"
                )
            raise VLLMBackendError(
                f"vLLM server at {self.root} failed {what} "
                f"(HTTP {exc.status_code}: {_error_detail(exc)}); {fix}"
            ) from exc
        except APIConnectionError as exc:
            raise self._unreachable(exc) from exc
        return _decode_json(content) if content else None

    async def aclose(self) -> None:
        await self._http.aclose()


def _decode_json(content: bytes) -> Any:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise MalformedResponseError(f"vLLM response is not valid JSON: {exc}") from None


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
        raise ValueError("VLLMBackend's client returns one message; sampling_args n must be 1")
    if args.get("stream"):
        raise ValueError("VLLMBackend's client does not stream; drop 'stream'")
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
        from vfops.local._batched import assistant_message

        # Decoded here (not the server's text) so content always matches the ids.
        text = str(self.memory.tokenizer.decode(completion_ids, skip_special_tokens=True))
        message, kind = assistant_message(text, tools, truncated=finish == "length")
        return message, kind if kind == "tool_calls" else finish

    async def aclose(self) -> None:
        """The backend owns the connection; close it with ``VLLMBackend.aclose``."""


# --------------------------------------------------------------------------- weight sync


def _save_weights(model: torch.nn.Module, target: Path) -> None:
    """Write ``model`` as a checkpoint directory vLLM can load (atomically renamed)."""
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_pretrained = getattr(model, "save_pretrained", None)
    if callable(save_pretrained):
        # Hugging Face models: checkpoint names, tied weights dropped, config.json.
        from vfops.local._tiny import quiet_progress

        with quiet_progress():
            save_pretrained(str(tmp), max_shard_size="1000GB")
    else:
        from safetensors.torch import save_model

        save_model(model, str(tmp / "model.safetensors"))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)


def _named_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Checkpoint-named parameters, each shared tensor once (tied embeddings)."""
    return [(name, p.detach()) for name, p in model.named_parameters()]


class NcclChannel(Protocol):
    """The trainer's end (rank 0) of the NCCL group with the vLLM workers."""

    def broadcast(self, tensors: list[torch.Tensor]) -> None: ...

    def close(self) -> None: ...


ChannelFactory = Callable[[str, int, int, "torch.device"], NcclChannel]
"""(master address, master port, world size, device) -> an open channel (blocks
until every vLLM worker has joined)."""


class _PyNcclChannel:
    def __init__(self, group: Any) -> None:
        self._group = group

    def broadcast(self, tensors: list[torch.Tensor]) -> None:
        import torch

        stream = torch.cuda.current_stream()
        for tensor in tensors:
            # NCCL sends numel elements from data_ptr(): never a strided view.
            self._group.broadcast(tensor.contiguous(), src=0, stream=stream)
        stream.synchronize()

    def close(self) -> None:
        destroy = getattr(self._group, "destroy", None)
        if callable(destroy):
            destroy()


def open_vllm_nccl_channel(
    address: str, port: int, world_size: int, device: torch.device
) -> NcclChannel:
    """Join vLLM's weight-transfer NCCL group as rank 0 (needs ``vllm`` and CUDA)."""
    import torch

    try:
        importlib.import_module("vllm")
    except ImportError as exc:
        raise VLLMBackendError(
            "generation.sync='nccl' needs vllm importable in the trainer's Python "
            "(pip install vllm in its venv), or use sync='filesystem'"
        ) from exc
    if device.type != "cuda":
        raise VLLMBackendError(
            f"generation.sync='nccl' needs the model on a CUDA device (it is on {device}); "
            "use sync='filesystem'"
        )
    torch.cuda.set_device(device)
    group: Any
    try:  # vLLM >= 0.2x: the helper its own trainer engine uses
        common: Any = importlib.import_module("vllm.distributed.weight_transfer.nccl_common")
        group = common.trainer_init(
            {"master_address": address, "master_port": port, "world_size": world_size}
        )
    except (ImportError, AttributeError):  # older vLLM: the TRL-era pattern
        pynccl: Any = importlib.import_module("vllm.distributed.device_communicators.pynccl")
        utils: Any = importlib.import_module("vllm.distributed.utils")
        pg = utils.StatelessProcessGroup.create(
            host=address, port=port, rank=0, world_size=world_size
        )
        group = pynccl.PyNcclCommunicator(pg, device=device)
    return _PyNcclChannel(group)


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


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
        self.server = _Server(config)
        self.policy_version = 0
        self.syncs = 0
        self._served: str | None = config.model
        self._client = VLLMClient(
            self,
            TurnMemory(tokenizer, mode=multiturn_tokens, capacity=config.prompt_cache_size),
            prompt_ids_fn,
        )
        self._sync_dir, self._own_sync_dir = self._make_sync_dir(config)
        self._last_dir: Path | None = None
        self._open_channel: ChannelFactory = nccl_channel or open_vllm_nccl_channel
        self._channel: NcclChannel | None = None
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

    @staticmethod
    def _make_sync_dir(config: VLLMGenerationConfig) -> tuple[Path | None, bool]:
        if config.sync != "filesystem":
            return None, False
        if not config.sync_dir:
            import tempfile

            return Path(tempfile.mkdtemp(prefix="vfops-vllm-sync-")), True
        path = Path(config.sync_dir)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise VLLMBackendError(
                f"generation.sync_dir {str(path)!r} cannot be created ({exc.strerror}); "
                "pick a writable directory the server can read"
            ) from exc
        return path, False

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
            if self.config.sync == "filesystem":
                await self._sync_filesystem(model, policy_version)
            else:
                await self._sync_nccl(model, policy_version)
            await self._reset_prefix_cache()
            self.policy_version = policy_version
            self.syncs += 1
            return time.perf_counter() - start

    async def _sync_filesystem(self, model: torch.nn.Module, version: int) -> None:
        assert self._sync_dir is not None
        target = self._sync_dir / f"policy-{version:08d}"
        try:
            await asyncio.to_thread(_save_weights, model, target)
        except OSError as exc:
            raise VLLMBackendError(
                f"cannot write weights to {str(target)!r} ({exc.strerror or exc}); "
                "check generation.sync_dir has room and is writable"
            ) from exc
        await self.server.admin(
            "POST",
            "/collective_rpc",
            # Only string arguments cross this endpoint (vLLM's rule).
            # vfops' worker extension (vfops vllm serve installs it): vLLM's own
            # reload_weights leaves a tied LM head on the old weights
            {"method": "vfops_load_weights", "kwargs": {"weights_path": str(target)}},
            what=f"vfops_load_weights from {target}",
            fix="start the server with `vfops vllm serve` (it adds the vfops worker "
            "extension), and check it can read generation.sync_dir",
        )
        previous, self._last_dir = self._last_dir, target
        if previous is not None and previous != target:
            shutil.rmtree(previous, ignore_errors=True)

    async def _sync_nccl(self, model: torch.nn.Module, version: int) -> None:
        weights = _named_weights(model)
        if not weights:
            raise VLLMBackendError("the model has no parameters to sync")
        channel = self._channel or await self._init_nccl(weights[0][1].device)
        update_info = {
            "names": [name for name, _ in weights],
            "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in weights],
            "shapes": [list(t.shape) for _, t in weights],
        }
        await self.server.admin("POST", "/start_weight_update", what="start_weight_update")
        # The workers receive inside /update_weights: it must be in flight while
        # this process broadcasts (both meet in the same NCCL calls).
        receive = asyncio.ensure_future(
            self.server.admin(
                "POST", "/update_weights", {"update_info": update_info}, what="update_weights"
            )
        )
        try:
            await asyncio.to_thread(channel.broadcast, [t for _, t in weights])
        except BaseException:
            receive.cancel()
            raise
        await receive
        await self.server.admin(
            "POST",
            "/finish_weight_update",
            {"weight_version": str(version)},
            what="finish_weight_update",
        )

    async def _init_nccl(self, device: torch.device) -> NcclChannel:
        info = await self.server.admin(
            "GET",
            "/get_world_size?include_dp=true",
            what="get_world_size",
            fix="start the server with `vfops vllm serve --sync nccl`",
        )
        world_size = 1 + int(info["world_size"])
        address = self.config.nccl_master_address
        port = self.config.nccl_master_port or _free_port(address)
        init = self.server.admin(
            "POST",
            "/init_weight_transfer_engine",
            {
                "init_info": {
                    "master_address": address,
                    "master_port": port,
                    "rank_offset": 1,
                    "world_size": world_size,
                    "packed": False,
                }
            },
            what="init_weight_transfer_engine",
            fix="start the server with `vfops vllm serve --sync nccl`",
        )
        # Workers block in the rendezvous until this process joins: run both at once.
        results = await asyncio.gather(
            init,
            asyncio.to_thread(self._open_channel, address, port, world_size, device),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                channel = results[1]
                if not isinstance(channel, BaseException):
                    channel.close()
                raise result
        channel = results[1]
        assert not isinstance(channel, BaseException)
        self._channel = channel
        return channel

    async def _reset_prefix_cache(self) -> None:
        """Cached KV of shared prefixes was computed by the old weights: drop it."""
        for running in ("false", "true"):
            # Fails while running requests hold blocks; the second try resets
            # those too (they are recomputed with the new weights).
            data = await self.server.admin(
                "POST",
                f"/reset_prefix_cache?reset_running_requests={running}",
                what="reset_prefix_cache",
            )
            if not isinstance(data, dict) or data.get("success", True):
                return
        raise VLLMBackendError(
            f"vLLM server at {self.server.root} could not reset its prefix cache after a "
            "weight sync; check the server log"
        )

    async def aclose(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            with contextlib.suppress(VLLMBackendError):
                await self.server.admin("POST", "/shutdown_weight_transfer_engine", what="shutdown")
            channel.close()
        await self.server.aclose()
        if self._own_sync_dir and self._sync_dir is not None:
            shutil.rmtree(self._sync_dir, ignore_errors=True)

    async def __aenter__(self) -> VLLMBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
