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
from vfops._redact import is_credential_param, public_url
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
    """What is wrong with ``base_url`` as a base URL (never quoting its credentials)."""
    try:
        parts = urlsplit(base_url)
        hostname = parts.hostname
    except ValueError:
        hostname = None
    if hostname is None or parts.scheme not in ("http", "https"):
        return f"{public_url(base_url)!r} is not an http(s) URL; use e.g. http://localhost:8000/v1"
    return None


def has_userinfo(base_url: str) -> bool:
    """Whether ``base_url`` carries ``user[:password]@`` (sent as basic auth)."""
    return "@" in urlsplit(base_url).netloc


def credentials_problem(base_url: str) -> str | None:
    """What credentials ``base_url`` carries (``user:password@``, a key-like query
    parameter), named without their values; ``None`` when it carries none."""
    parts = urlsplit(base_url)
    found = ["user:password@"] if "@" in parts.netloc else []
    found += [
        f"?{name}="
        for name in dict.fromkeys(
            pair.split("=", 1)[0] for pair in parts.query.split("&") if "=" in pair
        )
        if is_credential_param(name)
    ]
    return " and ".join(found) or None


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
    loopback base URL with the default variable, or for a base URL with
    ``user:password@`` (those are the request's credentials, sent as basic auth);
    otherwise raises :class:`EndpointError`. A set variable next to such a URL is
    refused too: a request carries one ``Authorization`` header.
    """
    var = endpoint.api_key_var
    value = os.environ.get(var, "")
    if has_userinfo(endpoint.base_url):
        if value:
            raise EndpointError(
                f"base URL {public_url(endpoint.base_url)} carries user:password@ (sent as "
                f"basic auth) and {var} holds an API key too: a request has one Authorization "
                f"header; drop the credentials from the URL, or unset {var} (or -k a variable "
                "that is unset)"
            )
        return LOCAL_API_KEY
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
    shown = public_url(base_url)
    if parts.scheme not in ("http", "https") or not host:
        raise EndpointError(f"cannot reach base URL {shown}: not an http(s) URL; check --base-url")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise EndpointError(
            f"cannot reach base URL {shown}: invalid port; check --base-url"
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
        f"cannot reach base URL {shown}: {reason}; check --base-url and that the server is running"
    )
