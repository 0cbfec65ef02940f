"""Whether a value is plain JSON, and where it is not.

A run's arguments (``env_args``, ``sampling_args``) are recorded as JSON and are part
of its fingerprint: an object there (a config class, a callable) cannot be recorded,
and would otherwise be found only once every rollout had run. The check names the
key path of the first such value, so the one-line error can say which one to change.
"""

from __future__ import annotations

from typing import Any, Final

from vfops._errors import VfopsError

__all__ = ["PLAIN_JSON", "UnrecordableValueError", "check_plain_json", "non_json_value"]

PLAIN_JSON: Final = (
    "plain JSON (objects with string keys, arrays, strings, numbers, true/false/null)"
)
"""What a recorded argument may hold, in words (for the errors' fixes)."""

_INT64: Final = (-(2**63), 2**64 - 1)  # what orjson writes as a JSON integer


def non_json_value(value: Any, path: str) -> tuple[str, str] | None:
    """The key path (``path.key[0]``) and type name of the first value in ``value`` that
    is not plain JSON, or ``None`` when all of it is."""
    if value is None or isinstance(value, str | bool | float):
        return None
    if isinstance(value, int):
        return None if _INT64[0] <= value <= _INT64[1] else (path, "integer beyond 64 bits")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return (f"{path}[{key!r}]", f"key of type {type(key).__name__}")
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
        raise UnrecordableValueError(
            f"{where} is a {kind}, which a run cannot record",
            f"pass {PLAIN_JSON} in {name} ({flag})",
        )
