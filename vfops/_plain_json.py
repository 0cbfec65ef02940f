"""Whether a value is plain JSON, and where it is not.

A run's arguments (``env_args``, ``sampling_args``) are recorded as JSON and are part
of its fingerprint: an object there (a config class, a callable) cannot be recorded,
and would otherwise be found only once every rollout had run. Nor can every value that
parses as JSON: PostgreSQL refuses a NUL character (``\\u0000``) in any string or key,
JSON has no ``NaN``/``Infinity`` (a TOML ``@FILE`` or a Python caller can pass them),
and a lone surrogate is no UTF-8. The check names the key path of the first such
value, so the one-line error can say which one to change, before any request is sent.
"""

from __future__ import annotations

import math
from typing import Any, Final

from vfops._errors import VfopsError

__all__ = ["PLAIN_JSON", "UnrecordableValueError", "check_plain_json", "non_json_value"]

PLAIN_JSON: Final = (
    "plain JSON (objects with string keys, arrays, strings, numbers, true/false/null)"
)
"""What a recorded argument may hold, in words (for the errors' fixes)."""

_INT64: Final = (-(2**63), 2**64 - 1)  # what orjson writes as a JSON integer

NUL_STRING: Final = "string with a NUL character (\\u0000)"
SURROGATE_STRING: Final = "string with a lone surrogate (not UTF-8)"
NON_FINITE: Final = "non-finite number"

_FIXES: Final = {
    NUL_STRING: "remove the NUL character (no registry can store it)",
    SURROGATE_STRING: "pass valid Unicode text",
    NON_FINITE: "pass a finite number (JSON has no NaN or Infinity)",
}
"""What to do about a value that is JSON in shape but cannot be stored, by its kind."""


def _string_problem(text: str) -> str | None:
    if "\x00" in text:
        return NUL_STRING
    try:
        text.encode()
    except UnicodeEncodeError:
        return SURROGATE_STRING
    return None


def non_json_value(value: Any, path: str) -> tuple[str, str] | None:
    """The key path (``path.key[0]``) and kind (a type name, or what is wrong with a
    string or number) of the first value in ``value`` that is not plain JSON a
    registry can store, or ``None`` when all of it is."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        problem = _string_problem(value)
        return None if problem is None else (path, problem)
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, f"{NON_FINITE} ({value})")
    if isinstance(value, int):
        return None if _INT64[0] <= value <= _INT64[1] else (path, "integer beyond 64 bits")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return (f"{path}[{key!r}]", f"key of type {type(key).__name__}")
            problem = _string_problem(key)
            if problem is not None:
                return (f"{path}[{key!r}]", problem.replace("string", "key", 1))
            found = non_json_value(item, f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = non_json_value(item, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    return (path, type(value).__name__)


class UnrecordableValueError(VfopsError):
    """A run's argument holds a value that cannot be recorded as JSON (never a fault of
    the database): ``problem`` names the value, ``fix`` says what to pass instead."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}; {fix}")
        self.problem = problem
        self.fix = fix


def check_plain_json(value: Any, name: str, flag: str) -> None:
    """Raise :class:`UnrecordableValueError` naming the first value of ``value`` (the
    argument ``name``, set with ``flag``) that is not plain JSON."""
    found = non_json_value(value, name)
    if found is not None:
        where, kind = found
        fix = next((fix for known, fix in _FIXES.items() if known in kind), None)
        raise UnrecordableValueError(
            f"{where} is a {kind}, which a run cannot record",
            f"{fix} in {name} ({flag})" if fix else f"pass {PLAIN_JSON} in {name} ({flag})",
        )
