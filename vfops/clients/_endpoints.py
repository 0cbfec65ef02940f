"""Endpoint aliases (``endpoints.toml``), API keys from the environment, reachability.

``endpoints.toml``::

    [[endpoint]]
    alias = "small"                    # what users pass as --model
    model = "gpt-4.1-mini"             # model name sent to the server
    base_url = "https://api.openai.com/v1"
    api_key_var = "OPENAI_API_KEY"     # NAME of the environment variable (default OPENAI_API_KEY)
    input_price_per_mtok = 0.40        # USD per million prompt tokens (optional)
    output_price_per_mtok = 1.60       # USD per million completion tokens
    cached_input_price_per_mtok = 0.10 # USD per million cached prompt tokens (default: input)

An endpoint without prices is unpriced: its runs' cost is shown as "unpriced", never 0.

Keys are never stored in the file: a literal ``api_key`` field is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from vfops._env_vars import check_env_var_name
from vfops._errors import EndpointError
from vfops.costs import Pricing

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_API_KEY_VAR = "OPENAI_API_KEY"
LOCAL_API_KEY = "EMPTY"
"""Sent to loopback servers (vLLM, the stub) when no key variable is set."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where to send requests for one model. ``api_key_var`` names the environment
    variable holding the key; the key itself is read only by :func:`read_api_key`."""

    alias: str
    model: str
    base_url: str
    api_key_var: str = DEFAULT_API_KEY_VAR
    pricing: Pricing | None = None
    """USD per million tokens (``None``: unpriced)."""


def url_problem(base_url: str) -> str | None:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{base_url!r} is not an http(s) URL; use e.g. http://localhost:8000/v1"
    return None


def check_base_url(base_url: str, where: str) -> None:
    problem = url_problem(base_url)
    if problem:
        raise EndpointError(f"{where}: base_url {problem}")


def check_api_key_var(name: str, where: str) -> None:
    try:
        check_env_var_name(name)
    except ValueError as exc:  # the message never echoes the value: it may be a key
        raise EndpointError(f"{where}: {exc}") from None


def is_loopback(base_url: str) -> bool:
    """True when ``base_url`` points at this machine (localhost, 127.0.0.0/8, ::1)."""
    host = urlsplit(base_url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_api_key(endpoint: Endpoint, *, required: bool) -> str:
    """The API key from the environment variable ``endpoint.api_key_var``.

    An unset/empty variable returns ``"EMPTY"`` when not ``required``, or for a
    loopback base URL with the default variable; otherwise raises
    :class:`EndpointError`.
    """
    var = endpoint.api_key_var
    value = os.environ.get(var, "")
    if value:
        return value
    if not required or (var == DEFAULT_API_KEY_VAR and is_loopback(endpoint.base_url)):
        return LOCAL_API_KEY
    raise EndpointError(
        f"environment variable {var} is not set; export {var}=... or pass --api-key-var"
    )


async def check_reachable(base_url: str, timeout_s: float = 3.0) -> None:
    """Open (and close) a TCP connection to ``base_url``'s host and port.

    Raises :class:`EndpointError` when that fails within ``timeout_s``.
    """
    parts = urlsplit(base_url)
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        raise EndpointError(
            f"cannot reach base URL {base_url}: not an http(s) URL; check --base-url"
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise EndpointError(
            f"cannot reach base URL {base_url}: invalid port; check --base-url"
        ) from None
    try:
        async with asyncio.timeout(timeout_s):
            _reader, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        reason = f"no connection within {timeout_s:g}s"
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
    else:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return
    raise EndpointError(
        f"cannot reach base URL {base_url}: {reason}; "
        "check --base-url and that the server is running"
    )
