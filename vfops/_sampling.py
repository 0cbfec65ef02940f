"""Sampling arguments every endpoint would refuse, found before a run is recorded.

Only the arguments with a range that holds for every OpenAI-compatible server are
checked (``temperature``, ``top_p``, ``max_tokens``, ``max_completion_tokens``),
plus ``extra_headers``: sampling arguments are recorded with the run (metadata.json,
the registry, MLflow), so a header that carries a credential is refused rather than
stored; anything else passes through to the endpoint as given.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["sampling_problems"]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _temperature(value: Any) -> str | None:
    if not _number(value) or not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    return None if value >= 0 else f"must be >= 0, got {value!r}"


def _top_p(value: Any) -> str | None:
    if not _number(value) or not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    return None if 0 < value <= 1 else f"must be > 0 and <= 1, got {value!r}"


def _token_count(value: Any) -> str | None:
    if not isinstance(value, int) or isinstance(value, bool):
        return f"must be an integer, got {value!r}"
    return None if value > 0 else f"must be > 0, got {value!r}"


# header names that carry a credential (compared lower-cased; a name that contains one of
# the words counts too: x-goog-api-key, x-auth-token, ...)
_CREDENTIAL_HEADER_WORDS = ("authorization", "api-key", "api_key", "apikey", "token", "secret",
                            "cookie", "password")  # fmt: skip


def _extra_headers(value: Any) -> str | None:
    if not isinstance(value, Mapping):
        return f"must be an object of header names to values, got {value!r}"
    for name in value:
        lowered = str(name).lower()
        if any(word in lowered for word in _CREDENTIAL_HEADER_WORDS):
            return (
                f"carries a credential ({name}), which would be recorded with the run; "
                "put the key in an environment variable and pass -k VAR instead"
            )
    return None


_RULES: dict[str, Callable[[Any], str | None]] = {
    "temperature": _temperature,
    "top_p": _top_p,
    "max_tokens": _token_count,
    "max_completion_tokens": _token_count,
    "extra_headers": _extra_headers,
}


def sampling_problems(args: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(name, problem)`` for each argument out of range, in ``args``'s order
    (``None`` passes: the endpoint's default)."""
    problems = []
    for name, value in args.items():
        rule = _RULES.get(name)
        problem = rule(value) if rule is not None and value is not None else None
        if problem is not None:
            problems.append((name, problem))
    return problems
