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
from dataclasses import dataclass
from typing import Annotated, ClassVar, Self
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, model_validator

from vfops._config import ConfigError, ConfigModel, EnvVarName, check_env_var_name, load_toml
from vfops._errors import EndpointError

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_API_KEY_VAR = "OPENAI_API_KEY"
LOCAL_API_KEY = "EMPTY"
"""Sent to loopback servers (vLLM, the stub) when no key variable is set."""


class EndpointsFileError(ConfigError, EndpointError):
    """An endpoints file is missing, malformed or has bad entries."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where to send requests for one model. ``api_key_var`` names the environment
    variable holding the key; the key itself is read only by :func:`read_api_key`."""

    alias: str
    model: str
    base_url: str
    api_key_var: str = DEFAULT_API_KEY_VAR


def _url_problem(base_url: str) -> str | None:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{base_url!r} is not an http(s) URL; use e.g. http://localhost:8000/v1"
    return None


def _http_base_url(value: str) -> str:
    problem = _url_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must be a non-empty string")
    return value


NonBlank = Annotated[str, AfterValidator(_not_blank)]


class EndpointEntry(ConfigModel):
    """One ``[[endpoint]]`` table of ``endpoints.toml``."""

    unknown_key_hints: ClassVar[dict[str, str]] = {
        "api_key": (
            "a literal api_key is not allowed (keys never go in this file); remove it and set "
            "api_key_var to the NAME of an environment variable holding the key"
        )
    }

    alias: NonBlank = Field(description="What users pass as --model.")
    model: NonBlank = Field(description="Model name sent to the server.")
    base_url: Annotated[NonBlank, AfterValidator(_http_base_url)] = Field(
        description="The server's OpenAI-compatible base URL, e.g. https://api.openai.com/v1."
    )
    api_key_var: Annotated[EnvVarName, AfterValidator(_not_blank)] = Field(
        default=DEFAULT_API_KEY_VAR,
        description="NAME of the environment variable holding the API key (never the key).",
    )

    def endpoint(self) -> Endpoint:
        return Endpoint(self.alias, self.model, self.base_url, self.api_key_var)


class EndpointsFile(ConfigModel):
    """``endpoints.toml``: one ``[[endpoint]]`` table per alias."""

    endpoint: list[EndpointEntry] = Field(
        default_factory=list, description="The endpoints, one [[endpoint]] table each."
    )

    @model_validator(mode="after")
    def _unique_aliases(self) -> Self:
        seen: dict[str, int] = {}
        for number, entry in enumerate(self.endpoint, start=1):
            if entry.alias in seen:
                raise ValueError(
                    f"duplicate alias {entry.alias!r} ([[endpoint]] #{seen[entry.alias]} and "
                    f"#{number}); aliases must be unique"
                )
            seen[entry.alias] = number
        return self


def _check_base_url(base_url: str, where: str) -> None:
    problem = _url_problem(base_url)
    if problem:
        raise EndpointError(f"{where}: base_url {problem}")


def _check_var(name: str, where: str) -> None:
    try:
        check_env_var_name(name)
    except ValueError as exc:  # the message never echoes the value: it may be a key
        raise EndpointError(f"{where}: {exc}") from None


def load_endpoints(path: str | os.PathLike[str]) -> dict[str, Endpoint]:
    """Parse an endpoints file into ``{alias: Endpoint}``.

    Raises :class:`EndpointsFileError` (an :class:`EndpointError`; one line per
    problem, each naming the file and the field) for a missing, non-UTF-8 or
    malformed file, a missing/empty/unknown field, a duplicate alias or a literal
    ``api_key`` (whose value is never shown).
    """
    file = load_toml(os.fspath(path), EndpointsFile, error=EndpointsFileError)
    return {entry.alias: entry.endpoint() for entry in file.endpoint}


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
