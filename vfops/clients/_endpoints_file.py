"""``endpoints.toml``: model aliases, read with the project's one config style (pydantic).

Kept apart from :mod:`vfops.clients._endpoints` so that an eval without an
endpoints file does not import pydantic.
"""

from __future__ import annotations

import os
from typing import Annotated, ClassVar, Self

from pydantic import AfterValidator, Field, model_validator

from vfops._config import ConfigError, ConfigModel, EnvVarName, load_toml
from vfops._errors import EndpointError
from vfops.clients._endpoints import (
    DEFAULT_API_KEY_VAR,
    Endpoint,
    credentials_problem,
    url_problem,
)
from vfops.costs import Pricing


class EndpointsFileError(ConfigError, EndpointError):
    """An endpoints file is missing, malformed or has bad entries."""


def _http_base_url(value: str) -> str:
    problem = url_problem(value)
    if problem:
        raise ValueError(problem)
    carried = credentials_problem(value)
    if carried:  # the value is never quoted: it holds a secret
        raise ValueError(
            f"it carries credentials ({carried}), and keys never go in this file; remove "
            "them and set api_key_var to the NAME of an environment variable holding the "
            "key (or pass a URL with credentials as --base-url)"
        )
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must be a non-empty string")
    return value


NonBlank = Annotated[str, AfterValidator(_not_blank)]
# TOML writes 3 as an integer: both are a price
Price = Annotated[float | int, Field(ge=0, allow_inf_nan=False)]


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

    input_price_per_mtok: Price | None = Field(
        default=None, description="USD per million prompt tokens (set with the output price)."
    )
    output_price_per_mtok: Price | None = Field(
        default=None, description="USD per million completion tokens (set with the input price)."
    )
    cached_input_price_per_mtok: Price | None = Field(
        default=None,
        description="USD per million prompt tokens served from the cache (default: the input "
        "price).",
    )

    @model_validator(mode="after")
    def _prices_together(self) -> Self:
        given = [self.input_price_per_mtok is not None, self.output_price_per_mtok is not None]
        if any(given) and not all(given):
            missing = "output_price_per_mtok" if given[0] else "input_price_per_mtok"
            raise ValueError(
                f"endpoint {self.alias!r} has one price but not {missing}; set both "
                "(USD per million tokens), or neither for an unpriced endpoint"
            )
        if self.cached_input_price_per_mtok is not None and not all(given):
            raise ValueError(
                f"endpoint {self.alias!r} has cached_input_price_per_mtok without "
                "input_price_per_mtok and output_price_per_mtok; set those too"
            )
        return self

    def endpoint(self) -> Endpoint:
        pricing = None
        if self.input_price_per_mtok is not None and self.output_price_per_mtok is not None:
            pricing = Pricing(
                float(self.input_price_per_mtok),
                float(self.output_price_per_mtok),
                None
                if self.cached_input_price_per_mtok is None
                else float(self.cached_input_price_per_mtok),
            )
        return Endpoint(self.alias, self.model, self.base_url, self.api_key_var, pricing)


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


def load_endpoints(path: str | os.PathLike[str]) -> dict[str, Endpoint]:
    """Parse an endpoints file into ``{alias: Endpoint}``.

    Raises :class:`EndpointsFileError` (an :class:`EndpointError`; one line per
    problem, each naming the file and the field) for a missing, non-UTF-8 or
    malformed file, a missing/empty/unknown field, a duplicate alias or a literal
    ``api_key`` (whose value is never shown).
    """
    file = load_toml(os.fspath(path), EndpointsFile, error=EndpointsFileError)
    return {entry.alias: entry.endpoint() for entry in file.endpoint}
