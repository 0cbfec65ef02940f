"""``--model`` (+ ``--base-url``/``--api-key-var``) resolved to an :class:`Endpoint`.

Its own module, above both the endpoint type (:mod:`vfops.clients._endpoints`, no
pydantic) and the endpoints file's reader (:mod:`vfops.clients._endpoints_file`, which
loads pydantic only when a file is given), so neither of those imports the other.
"""

from __future__ import annotations

import os

from vfops._errors import EndpointError
from vfops.clients._endpoints import (
    DEFAULT_API_KEY_VAR,
    DEFAULT_BASE_URL,
    Endpoint,
    check_api_key_var,
    check_base_url,
)

__all__ = ["resolve_endpoint"]


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
        check_base_url(base_url, "--base-url")
    if api_key_var is not None:
        check_api_key_var(api_key_var, "--api-key-var")
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
