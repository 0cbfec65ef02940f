"""The installed loss variants' names, read from their entry points (no torch, no
import of any variant): what the config checks ``[loss] type`` against."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Final

from vfops._errors import InvalidArgumentError

__all__ = ["LOSS_GROUP", "RENAMED", "check_loss_name", "loss_names"]

LOSS_GROUP: Final = "vfops.losses"
RENAMED: Final = {"bnpo": "dapo"}
"""Old names that now mean another formula, refused with the new name: vfops's ``bnpo``
was a token mean over the step, which the field calls DAPO's aggregation (TRL's ``bnpo``
normalises per micro-batch)."""


def loss_names() -> list[str]:
    """The installed loss variants' names (no import of torch or of any variant)."""
    return sorted({ep.name for ep in entry_points(group=LOSS_GROUP)})


def check_loss_name(name: str) -> str:
    """``name`` if a variant is installed under it; else one line naming the fix."""
    if name in RENAMED:
        raise InvalidArgumentError(
            f"loss type {name!r} is now {RENAMED[name]!r} (a token mean over the step's "
            f"trained tokens); set [loss] type = {RENAMED[name]!r}"
        )
    names = loss_names()
    if name not in names:
        raise InvalidArgumentError(
            f"unknown loss type {name!r}; installed: {', '.join(names)} (a package adds one "
            f"under the {LOSS_GROUP} entry point)"
        )
    return name
