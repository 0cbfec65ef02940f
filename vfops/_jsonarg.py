"""Parsing of JSON-valued command-line options."""

from __future__ import annotations

from typing import Any

import orjson

from vfops._errors import VfopsError


def parse_json_object(text: str | None, option: str) -> dict[str, Any]:
    """Parse ``text`` as a JSON object, or raise a one-line error naming ``option``."""
    if text is None or not text.strip():
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise VfopsError(
            f"{option} is not valid JSON ({exc}); pass an object such as '{{\"temperature\": 0.7}}'"
        ) from exc
    if not isinstance(value, dict):
        raise VfopsError(f"{option} must be a JSON object, got {type(value).__name__}")
    return value
