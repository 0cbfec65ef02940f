"""Model clients: the :class:`ModelClient` protocol and its implementations."""

from typing import TYPE_CHECKING

from vfops._lazy import lazy_exports
from vfops._redact import redact_secrets
from vfops.clients._base import TOKENS_KEY, ChatResponse, ModelClient, PromptTooLongError
from vfops.clients._endpoints import (
    DEFAULT_API_KEY_VAR,
    Endpoint,
    check_reachable,
    is_loopback,
    read_api_key,
)
from vfops.clients._errors import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InternalServerError,
    MalformedResponseError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    RequestTooLargeError,
    UnprocessableEntityError,
)
from vfops.clients._middleware import ChatRequest, PricedRequests, RequestMiddleware
from vfops.clients._middleware import installed as installed_middleware
from vfops.clients._resolve import resolve_endpoint
from vfops.clients._retry import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_MAX_RETRY_WAIT_S,
    DEFAULT_MAX_TIMEOUT_RETRIES,
    RetryPolicy,
)
from vfops.clients._scripted import ScriptedClient

__all__ = [
    "DEFAULT_API_KEY_VAR",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_MAX_RETRY_WAIT_S",
    "DEFAULT_MAX_TIMEOUT_RETRIES",
    "TOKENS_KEY",
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ChatRequest",
    "ChatResponse",
    "ConflictError",
    "Endpoint",
    "HTTPTransport",
    "InternalServerError",
    "MalformedResponseError",
    "ModelClient",
    "NotFoundError",
    "OpenAIClient",
    "PermissionDeniedError",
    "PricedRequests",
    "PromptTooLongError",
    "RateLimitError",
    "RequestLimiter",
    "RequestMiddleware",
    "RequestTooLargeError",
    "RetryPolicy",
    "ScriptedClient",
    "UnprocessableEntityError",
    "check_reachable",
    "installed_middleware",
    "is_context_error",
    "is_loopback",
    "load_endpoints",
    "read_api_key",
    "redact_secrets",
    "resolve_endpoint",
]

# pydantic (the endpoints file's model) only when a file is read: not on every eval;
# aiohttp only where a request is sent (not in the registry's or the tracker's process,
# which import the environment modules through the registry calls they serve)
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "load_endpoints": "vfops.clients._endpoints_file",
        "HTTPTransport": "vfops.clients._http",
        "OpenAIClient": "vfops.clients._openai",
        "RequestLimiter": "vfops.clients._openai",
        "is_context_error": "vfops.clients._openai",
    },
    __all__,
)

if TYPE_CHECKING:
    from vfops.clients._endpoints_file import load_endpoints
    from vfops.clients._http import HTTPTransport
    from vfops.clients._openai import OpenAIClient, RequestLimiter, is_context_error
