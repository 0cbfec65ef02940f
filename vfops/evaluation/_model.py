"""Resolve ``--model`` into a ready client: an endpoint alias or name, ``local:DIR``,
or ``models:/NAME@ALIAS`` / ``models:/NAME/VERSION`` from the MLflow model registry."""

from __future__ import annotations

import difflib
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vfops._errors import EndpointError, VfopsError
from vfops._redact import public_url
from vfops.clients import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_MAX_RETRY_WAIT_S,
    DEFAULT_MAX_TIMEOUT_RETRIES,
    ModelClient,
)

if TYPE_CHECKING:
    from vfops.clients import Endpoint, OpenAIClient, RequestLimiter

log = logging.getLogger("vfops.evaluation")

LOCAL_PREFIX = "local:"
MODEL_URI_PREFIX = "models:/"

DEFAULT_REQUEST_TIMEOUT_S = 600.0
"""Ten minutes for one response (the ``openai`` SDK's default): a reasoning model at
high effort legitimately takes minutes. A hung endpoint costs about three times this
per request, not ``max_retries + 1`` times it: a timeout is retried at most
``max_timeout_retries`` (2) times."""

MODEL_LIST_TIMEOUT_S = 5.0
"""The model-name check waits this long for ``GET /models``, then skips the check."""

MODELS_SHOWN = 20
"""A model-name error lists this many served models at most."""


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
    """Seconds one attempt may take, wall-clock, from sending the request to the last
    byte of the response (a body that trickles in does not extend it). A request with
    no complete response after its retries is an error of the rollout (never scored), unlike an
    environment's own turn or rollout timeout (stop reason ``timeout``)."""
    max_retries: int = DEFAULT_MAX_RETRIES
    """Retries per request on 5xx/timeouts/connection errors (and a 429 that names no wait)."""
    max_timeout_retries: int = DEFAULT_MAX_TIMEOUT_RETRIES
    """How many of a request's retries may follow a timeout (each one waited the
    full ``request_timeout_s``)."""
    max_retry_wait_s: float = DEFAULT_MAX_RETRY_WAIT_S
    """Seconds one request may spend waiting on 429s that name their wait
    (``Retry-After``); these waits are not counted in ``max_retries``."""
    check_model: bool = True
    """Before the run, check the model name against the endpoint's ``GET /models``
    (skipped where the endpoint lists none)."""
    limiter: RequestLimiter | None = None
    """Admission control around every request (a shared Prefect budget). When set,
    it is the only one: an explicit budget wins over adaptive concurrency."""
    adaptive_concurrency: bool = True
    """Without a ``limiter``, learn the endpoint's concurrency limit from its 429s
    (:class:`vfops.budget.AdaptiveLimiter`, one per base URL and model in a process):
    no cap until the endpoint pushes back. ``False``: requests go out as the
    rollout concurrency sends them."""
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
        if self.max_timeout_retries < 0:
            raise VfopsError(
                f"max_timeout_retries must be >= 0 (0: a timeout is not retried), "
                f"got {self.max_timeout_retries}"
            )
        if not self.max_retry_wait_s >= 0:
            raise VfopsError(
                f"--max-retry-wait must be >= 0 seconds (0: fail on the first 429), "
                f"got {self.max_retry_wait_s}"
            )


@dataclass
class ModelConnection:
    client: ModelClient
    model: str
    """The name recorded on the run (a registry model pinned to its version)."""
    base_url: str | None
    priced: bool = False
    """The endpoint has prices: its calls have a cost (in-process models cost nothing)."""


def is_in_process(model: str) -> bool:
    return model.startswith((LOCAL_PREFIX, MODEL_URI_PREFIX))


def resolve_model_name(model: str, options: ModelOptions) -> tuple[str, str | None]:
    """The model name and base URL a run of ``model`` records, without connecting."""
    if is_in_process(model):
        return model, None
    from vfops.clients import resolve_endpoint

    endpoint = resolve_endpoint(
        model,
        endpoints_file=options.endpoints_file,
        base_url=options.base_url,
        api_key_var=options.api_key_var,
    )
    return endpoint.model, public_url(endpoint.base_url)


async def connect_model(model: str, options: ModelOptions) -> ModelConnection:
    """Resolve ``model``, read its key from the environment, check the endpoint is
    reachable and, where it lists its models (``options.check_model``), that it
    serves this one: :class:`EndpointError` (one line naming the served models)
    before any rollout is generated."""
    if model.startswith(LOCAL_PREFIX):
        return _connect_local(model[len(LOCAL_PREFIX) :], options.seed)
    if model.startswith(MODEL_URI_PREFIX):
        return await _connect_registry(model, options.seed)
    from vfops.clients import OpenAIClient, check_reachable, read_api_key, resolve_endpoint

    endpoint = resolve_endpoint(
        model,
        endpoints_file=options.endpoints_file,
        base_url=options.base_url,
        api_key_var=options.api_key_var,
    )
    # Required: a loopback server with the default variable unset gets "EMPTY".
    api_key = read_api_key(endpoint, required=True)
    await check_reachable(endpoint.base_url)
    limiter = options.limiter
    if limiter is None and options.adaptive_concurrency:
        from vfops.budget import shared_adaptive_limiter

        limiter = shared_adaptive_limiter(
            f"{public_url(endpoint.base_url).rstrip('/')} {endpoint.model}"
        )
    client = OpenAIClient(
        endpoint.base_url,
        api_key,
        timeout_s=options.request_timeout_s,
        max_retries=options.max_retries,
        max_timeout_retries=options.max_timeout_retries,
        max_retry_wait_s=options.max_retry_wait_s,
        limiter=limiter,
        pricing=endpoint.pricing,
    )
    if options.check_model:
        try:
            await _check_model_served(client, endpoint)
        except BaseException:
            await client.aclose()
            raise
    return ModelConnection(
        client=client,
        model=endpoint.model,
        base_url=public_url(endpoint.base_url),  # recorded: never its credentials
        priced=endpoint.pricing is not None,
    )


async def _check_model_served(client: OpenAIClient, endpoint: Endpoint) -> None:
    """Fail with one line naming the served models when the endpoint lists its models
    and ``endpoint.model`` is not among them; otherwise (no list) do nothing."""
    from vfops.clients import APIError

    try:
        served = await client.list_models(timeout_s=MODEL_LIST_TIMEOUT_S)
    except APIError as exc:  # no /models route, auth-protected, slow: the run will tell
        log.debug("not checking the model name: %s", exc)
        return
    model = endpoint.model
    # Ollama lists "name:latest" and serves it as "name" too.
    if not served or model in served or f"{model}:latest" in served:
        return
    named = f"model {model!r}" + (f" (alias {endpoint.alias!r})" if endpoint.alias != model else "")
    raise EndpointError(
        f"{named} is not served at {client.base_url}; it serves {_some_models(model, served)}; "
        "pass one of them with -m (or --no-check-model if the server accepts names it does "
        "not list)"
    )


def _some_models(model: str, served: list[str]) -> str:
    """The served models, closest to ``model`` first, at most :data:`MODELS_SHOWN`."""
    unique = sorted(set(served))
    close = difflib.get_close_matches(model, unique, n=MODELS_SHOWN, cutoff=0.5)
    shown = close + [name for name in unique if name not in close][: MODELS_SHOWN - len(close)]
    text = ", ".join(shown)
    if len(unique) > len(shown):
        text += f" and {len(unique) - len(shown)} more"
    return text


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
    from vfops.checkpoints import open_model_version_async

    opened = await open_model_version_async(uri, seed=0 if seed is None else seed)
    return ModelConnection(client=opened.client, model=opened.uri, base_url=None)
