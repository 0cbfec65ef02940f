"""Talking to a vLLM server: its config, its HTTP routes, its errors.

Light module (no torch). The OpenAI ``/v1/completions`` route is called with
retries (429/5xx/connection errors, :class:`~vfops.clients._retry.RetryPolicy`);
the root-level admin routes (``/collective_rpc``, ``/reset_prefix_cache``, the
weight-transfer routes) without, because they are not always idempotent and a
failure must surface. Every failure is one :class:`VLLMBackendError` line naming
the fix. The generation backend (:mod:`vfops.training._vllm`) and the weight sync
(:mod:`vfops.training._vllm_sync`) both go through one :class:`VLLMServer`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Literal

import orjson
from pydantic import ConfigDict, Field

from vfops._errors import VfopsError
from vfops.clients import (
    APIConnectionError,
    APIStatusError,
    HTTPTransport,
    MalformedResponseError,
    PromptTooLongError,
    RetryPolicy,
    is_context_error,
)
from vfops.training._config import VLLMServerSettings

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
        min_length=1,
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


class VLLMServer:
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
                data: dict[str, Any] = decode_json(content)
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
        return decode_json(content) if content else None

    async def aclose(self) -> None:
        await self._http.aclose()


def decode_json(content: bytes) -> Any:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise MalformedResponseError(f"vLLM response is not valid JSON: {exc}") from None
