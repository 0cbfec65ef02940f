"""Resolve ``--model`` into a ready client: an endpoint alias or name, ``local:DIR``,
or ``models:/NAME@ALIAS`` / ``models:/NAME/VERSION`` from the MLflow model registry."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vfops._errors import VfopsError
from vfops.clients._base import ModelClient

if TYPE_CHECKING:
    from vfops.clients._openai import RequestLimiter

LOCAL_PREFIX = "local:"
MODEL_URI_PREFIX = "models:/"

DEFAULT_REQUEST_TIMEOUT_S = 600.0
DEFAULT_MAX_RETRIES = 5


@dataclass
class ModelOptions:
    """How to reach the model (never part of a run's identity; holds no key)."""

    base_url: str | None = None
    """OpenAI-compatible base URL (overrides an alias's)."""
    api_key_var: str | None = None
    """Name of the environment variable holding the API key."""
    endpoints_file: str | Path | None = None
    """``endpoints.toml`` with model aliases."""
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    """Seconds before one model request times out (then retried)."""
    max_retries: int = DEFAULT_MAX_RETRIES
    """Retries per request on 429/5xx/timeouts/connection errors."""
    limiter: RequestLimiter | None = None
    """Admission control around every request (a shared Prefect budget)."""
    seed: int | None = None
    """Sampling seed of a model loaded in-process (``local:``; ``models:/`` uses 0 when unset)."""

    def validate(self) -> None:
        """Refuse a timeout or retry count no request could run with."""
        if not self.request_timeout_s > 0 or not math.isfinite(self.request_timeout_s):
            raise VfopsError(
                f"--request-timeout must be > 0 seconds, got {self.request_timeout_s}; "
                f"e.g. --request-timeout {DEFAULT_REQUEST_TIMEOUT_S:g}"
            )
        if self.max_retries < 0:
            raise VfopsError(f"--max-retries must be >= 0 (0: no retries), got {self.max_retries}")


@dataclass
class ModelConnection:
    client: ModelClient
    model: str
    """The name recorded on the run (a registry model pinned to its version)."""
    base_url: str | None


def is_in_process(model: str) -> bool:
    return model.startswith((LOCAL_PREFIX, MODEL_URI_PREFIX))


def resolve_model_name(model: str, options: ModelOptions) -> tuple[str, str | None]:
    """The model name and base URL a run of ``model`` records, without connecting."""
    if is_in_process(model):
        return model, None
    from vfops.clients._endpoints import resolve_endpoint

    endpoint = resolve_endpoint(
        model,
        endpoints_file=options.endpoints_file,
        base_url=options.base_url,
        api_key_var=options.api_key_var,
    )
    return endpoint.model, endpoint.base_url


async def connect_model(model: str, options: ModelOptions) -> ModelConnection:
    """Resolve ``model``, read its key from the environment and check it is reachable."""
    if model.startswith(LOCAL_PREFIX):
        return _connect_local(model[len(LOCAL_PREFIX) :], options.seed)
    if model.startswith(MODEL_URI_PREFIX):
        return await _connect_registry(model, options.seed)
    from vfops.clients._endpoints import check_reachable, read_api_key, resolve_endpoint
    from vfops.clients._openai import OpenAIClient

    endpoint = resolve_endpoint(
        model,
        endpoints_file=options.endpoints_file,
        base_url=options.base_url,
        api_key_var=options.api_key_var,
    )
    # Required: a loopback server with the default variable unset gets "EMPTY".
    api_key = read_api_key(endpoint, required=True)
    await check_reachable(endpoint.base_url)
    client = OpenAIClient(
        endpoint.base_url,
        api_key,
        timeout_s=options.request_timeout_s,
        max_retries=options.max_retries,
        limiter=options.limiter,
    )
    return ModelConnection(client=client, model=endpoint.model, base_url=endpoint.base_url)


def _connect_local(model_dir: str, seed: int | None) -> ModelConnection:
    path = Path(model_dir).expanduser()
    if not (path / "config.json").exists():
        raise VfopsError(
            f"{path} is not a model directory (no config.json); build one with: "
            f"vfops model build-tiny {path}"
        )
    from vfops.local import LocalModelClient

    client = LocalModelClient(path, seed=seed)
    return ModelConnection(client=client, model=f"local:{path.name}", base_url=None)


async def _connect_registry(uri: str, seed: int | None) -> ModelConnection:
    """``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``, loaded in-process.

    The run records the pinned ``models:/NAME/VERSION``, so it can later serve as
    promotion evidence for that version.
    """
    from vfops.models._inprocess import open_model_version_async

    opened = await open_model_version_async(uri, seed=0 if seed is None else seed)
    return ModelConnection(client=opened.client, model=opened.uri, base_url=None)
