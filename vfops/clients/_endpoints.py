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


def _check_base_url(base_url: str, where: str) -> None:
    problem = url_problem(base_url)
    if problem:
        raise EndpointError(f"{where}: base_url {problem}")


def _check_var(name: str, where: str) -> None:
    try:
        check_env_var_name(name)
    except ValueError as exc:  # the message never echoes the value: it may be a key
        raise EndpointError(f"{where}: {exc}") from None


def resolve_endpoint(
    model_or_alias: str,
    *,
    endpoints_file: str | os.PathLike[str] | None = None,
    base_url: str | None = None,
    api_key_var: str | None = None,
) -> Endpoint:
    """Turn ``--model`` (+ ``--base-url``/``--api-key-var``) into an :class:`Endpoint`.

    An alias from ``endpoints_file`` supplies model, base URL and key variable; an
    explicit ``base_url`` / ``api_key_var`` overrides the alias's. A name that is
    not an alias is a literal model name: it needs ``base_url`` when an endpoints
    file is given (else it is a typo: :class:`EndpointError` lists the aliases),
    and defaults to the OpenAI API when there is no file.
    """
    if base_url is not None:
        _check_base_url(base_url, "--base-url")
    if api_key_var is not None:
        _check_var(api_key_var, "--api-key-var")
    endpoints: dict[str, Endpoint] = {}
    if endpoints_file is not None:
        # pydantic, only for a file (~0.1 s of an eval's start-up otherwise)
        from vfops.clients._endpoints_file import load_endpoints

        endpoints = load_endpoints(endpoints_file)
    found = endpoints.get(model_or_alias)
    if found is not None:
        return Endpoint(
            alias=found.alias,
            model=found.model,
            base_url=base_url or found.base_url,
            api_key_var=api_key_var or found.api_key_var,
            pricing=found.pricing,
        )
    if base_url is None and endpoints_file is not None:
        known = ", ".join(sorted(endpoints)) or "(none)"
        raise EndpointError(
            f"unknown model alias {model_or_alias!r} in {endpoints_file}; known aliases: "
            f"{known}; add an [[endpoint]] for it or pass --base-url"
        )
    return Endpoint(
        alias=model_or_alias,
        model=model_or_alias,
        base_url=base_url or DEFAULT_BASE_URL,
        api_key_var=api_key_var or DEFAULT_API_KEY_VAR,
    )


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
