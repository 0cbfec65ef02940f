"""Nested settings as flat MLflow params, never a credential."""

from __future__ import annotations

import re
from typing import Any, Final

import orjson

_MAX_PARAM_VALUE: Final = 6000
# A parameter whose flattened name looks like a credential is never logged.
_SECRET_NAME = re.compile(
    r"(api[_-]?key|secret|passw(or)?d|authorization|credential|(^|[._-])token$)", re.I
)


def flatten_params(prefix: str, value: Any, out: dict[str, str]) -> None:
    """Add ``value`` to ``out`` as MLflow params named ``prefix.key.subkey...``; a name that
    looks like a credential (api key, token, password, ...) is never added."""
    if isinstance(value, dict) and value:
        for key, inner in value.items():
            flatten_params(f"{prefix}.{key}", inner, out)
        return
    if _SECRET_NAME.search(prefix.rsplit(".", 1)[-1]):
        return
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    if len(text) > _MAX_PARAM_VALUE:
        text = text[: _MAX_PARAM_VALUE - 3] + "..."
    out[prefix] = text
