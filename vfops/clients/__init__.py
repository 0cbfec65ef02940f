"""Model clients: the :class:`ModelClient` protocol and its implementations."""

from vfops.clients._base import ChatResponse, ModelClient, PromptTooLongError
from vfops.clients._endpoints import (
    Endpoint,
    check_reachable,
    load_endpoints,
    read_api_key,
    resolve_endpoint,
)
from vfops.clients._openai import OpenAIClient
from vfops.clients._retry import RetryPolicy
from vfops.clients._scripted import ScriptedClient

__all__ = [
    "ChatResponse",
    "Endpoint",
    "ModelClient",
    "OpenAIClient",
    "PromptTooLongError",
    "RetryPolicy",
    "ScriptedClient",
    "check_reachable",
    "load_endpoints",
    "read_api_key",
    "resolve_endpoint",
]
