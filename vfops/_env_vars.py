"""The check that a config field or flag names an environment variable, not a secret.

Its own module, free of pydantic: ``vfops eval -k VAR`` checks the name at start-up,
and importing the config layer for one regular expression costs ~0.1 s there.
"""

from __future__ import annotations

import re

from vfops._errors import InvalidArgumentError

__all__ = ["check_env_var_name"]

_ENV_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_env_var_name(value: str) -> str:
    """``value`` unless it is not an environment variable name (never echoed: it may be
    a key pasted into the wrong field); ``""`` passes (no variable)."""
    if value and not _ENV_VAR_NAME.fullmatch(value):
        raise InvalidArgumentError(
            "must be the NAME of an environment variable (letters, digits, _), not the key "
            'itself; e.g. api_key_var = "OPENAI_API_KEY"'
        )
    return value
