"""Endpoint aliases (``endpoints.toml``), API keys from the environment, reachability.

``endpoints.toml``::

    [[endpoint]]
    alias = "small"                    # what users pass as --model
    model = "gpt-4.1-mini"             # model name sent to the server
    base_url = "https://api.openai.com/v1"
    api_key_var = "OPENAI_API_KEY"     # NAME of the environment variable (default OPENAI_API_KEY)

Keys are never stored in the file: a literal ``api_key`` field is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from vfops._errors import EndpointError

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_API_KEY_VAR = "OPENAI_API_KEY"
LOCAL_API_KEY = "EMPTY"
"""Sent to loopback servers (vLLM, the stub) when no key variable is set."""

_REQUIRED = ("alias", "model", "base_url")
_OPTIONAL = ("api_key_var",)
_VAR_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where to send requests for one model. ``api_key_var`` names the environment
    variable holding the key; the key itself is read only by :func:`read_api_key`."""

    alias: str
    model: str
    base_url: str
    api_key_var: str = DEFAULT_API_KEY_VAR


def _check_base_url(base_url: str, where: str) -> None:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EndpointError(
            f"{where}: base_url {base_url!r} is not an http(s) URL; "
            "use e.g. http://localhost:8000/v1"
        )


def _check_var(name: str, where: str) -> None:
    if not _VAR_RE.fullmatch(name):
        # never echo the value: it may be a key pasted into the wrong field
        raise EndpointError(
            f"{where}: api_key_var must be the NAME of an environment variable "
            '(letters, digits, _), not the key itself; e.g. api_key_var = "OPENAI_API_KEY"'
        )


def load_endpoints(path: str | os.PathLike[str]) -> dict[str, Endpoint]:
    """Parse an endpoints file into ``{alias: Endpoint}``.

    Raises :class:`EndpointError` (one line, naming the file and the fix) for a
    missing file, bad TOML, a missing/empty/unknown field, a duplicate alias or a
    literal ``api_key``.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EndpointError(
            f"endpoints file {file} not found; create it or pass the right path"
        ) from None
    except OSError as exc:
        raise EndpointError(f"cannot read endpoints file {file}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise EndpointError(f"{file}: invalid TOML ({exc}); fix the syntax") from None

    tables = data.get("endpoint", [])
    unknown_top = sorted(set(data) - {"endpoint"})
    if unknown_top:
        raise EndpointError(
            f"{file}: unknown top-level key {unknown_top[0]!r}; "
            "define endpoints as [[endpoint]] tables"
        )
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise EndpointError(f"{file}: 'endpoint' must be an array of tables; write [[endpoint]]")

    endpoints: dict[str, Endpoint] = {}
    for number, table in enumerate(tables, start=1):
        name = table.get("alias")
        where = f"{file}: endpoint #{number}" + (
            f" ({name!r})" if isinstance(name, str) and name else ""
        )
        if "api_key" in table:
            raise EndpointError(
                f"{where} has a literal api_key; remove it and set api_key_var to the NAME "
                "of an environment variable holding the key"
            )
        for key in _REQUIRED:
            if key not in table:
                raise EndpointError(
                    f"{where} is missing {key!r}; every [[endpoint]] needs "
                    "alias, model and base_url (api_key_var is optional)"
                )
        for key in sorted(table):
            if key not in _REQUIRED and key not in _OPTIONAL:
                raise EndpointError(
                    f"{where} has unknown field {key!r}; allowed: alias, model, base_url, "
                    "api_key_var"
                )
            value = table[key]
            if not isinstance(value, str) or not value.strip():
                raise EndpointError(f"{where}: {key!r} must be a non-empty string")
        alias = table["alias"]
        api_key_var = table.get("api_key_var", DEFAULT_API_KEY_VAR)
        _check_var(api_key_var, where)
        _check_base_url(table["base_url"], where)
        if alias in endpoints:
            raise EndpointError(
                f"{file}: duplicate alias {alias!r} (endpoint #{number}); aliases must be unique"
            )
        endpoints[alias] = Endpoint(
            alias=alias, model=table["model"], base_url=table["base_url"], api_key_var=api_key_var
        )
    return endpoints


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
    endpoints = load_endpoints(endpoints_file) if endpoints_file is not None else {}
    found = endpoints.get(model_or_alias)
    if found is not None:
        return Endpoint(
            alias=found.alias,
            model=found.model,
            base_url=base_url or found.base_url,
            api_key_var=api_key_var or found.api_key_var,
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
