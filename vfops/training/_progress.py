"""The progress callback a training run reports to (the CLI's log lines, a flow's logger).

Its own module: the recipe calls it in-process and the launcher relays it from the
processes ``accelerate launch`` starts, and neither should import the other for a type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

Progress: TypeAlias = Callable[[str, int, dict[str, float]], None]
"""``progress(kind, step, metrics)``: ``kind`` is ``"step"`` or ``"eval"``."""
