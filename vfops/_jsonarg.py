"""Parsing of JSON-valued command-line options.

A value may also name a file, ``@PATH``: a JSON object, or a TOML table when the file
ends in ``.toml`` (e.g. a taskset's judges written once and reused, as ``vf-eval``
takes ``@ config.toml``).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import orjson

from vfops._errors import VfopsError


def parse_json_object(text: str | None, option: str) -> dict[str, Any]:
    """Parse ``text`` as a JSON object (or ``@FILE``), or raise a one-line error naming
    ``option``."""
    if text is None or not text.strip():
        return {}
    if text.startswith("@"):
        return _from_file(Path(text[1:].strip()), option)
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise VfopsError(
            f"{option} is not valid JSON ({exc}); pass an object such as '{{\"temperature\": 0.7}}'"
        ) from exc
    if not isinstance(value, dict):
        raise VfopsError(f"{option} must be a JSON object, got {type(value).__name__}")
    return value


def _from_file(path: Path, option: str) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise VfopsError(
            f"{option} @{path}: cannot read it ({exc.strerror}); name a JSON or .toml file"
        ) from exc
    try:
        value: Any = tomllib.loads(raw.decode()) if path.suffix == ".toml" else orjson.loads(raw)
    except (tomllib.TOMLDecodeError, orjson.JSONDecodeError, UnicodeDecodeError) as exc:
        kind = "TOML" if path.suffix == ".toml" else "JSON"
        raise VfopsError(
            f"{option} @{path} is not valid {kind} ({str(exc).splitlines()[0]}); fix the file"
        ) from exc
    if not isinstance(value, dict):
        raise VfopsError(f"{option} @{path} must hold an object, got {type(value).__name__}")
    return value
