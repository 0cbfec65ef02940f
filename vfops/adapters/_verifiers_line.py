"""Which ``verifiers`` line is installed: its classic API (0.3) or only its v1 tasksets
(0.4 on). The two cannot share a virtualenv (``[verifiers]`` pins <0.4,
``[verifiers-v1]`` >=0.4), so whichever is installed decides which of vfops's two
``verifiers`` libraries finds packages; read from package metadata, so asking imports no
``verifiers`` (seconds)."""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Literal

Line = Literal["classic", "v1"]


def release(text: str) -> tuple[int, int, int]:
    """``0.4.0rc1`` -> ``(0, 4, 0)``: the numeric release, local and pre-release parts dropped."""
    parts: list[int] = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        parts.append(int(digits or 0))
    major, minor, patch = [*parts, 0, 0, 0][:3]
    return major, minor, patch


@cache
def installed_line() -> Line | None:
    """``"classic"`` for verifiers 0.3.x, ``"v1"`` for 0.4 and later, None when it is
    not installed (or older than either: 0.3.1 is the first classic release vfops runs)."""
    try:
        found = release(version("verifiers"))
    except PackageNotFoundError:
        return None
    if found >= (0, 4, 0):
        return "v1"
    if found >= (0, 3, 1):
        return "classic"
    return None
