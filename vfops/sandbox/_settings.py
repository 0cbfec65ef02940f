"""The sandboxes' host-wide settings, from environment variables (read at call time).

Light on purpose (no pydantic): the CLI's start reads them when it reaps.
"""

from __future__ import annotations

import os
from typing import Final

from vfops._errors import VfopsError

DEFAULT_ENGINE: Final = "podman"
DEFAULT_MAX_CONTAINERS: Final = 16
DEFAULT_LIFETIME_S: Final = 3600.0
"""A container's main process is ``sleep`` for this long: one that nobody removes (its
owner killed, the host's cleaner not run yet) ends itself then and is removed."""


def engine_name() -> str:
    """``VFOPS_SANDBOX_ENGINE``: the container engine's name (``podman``, ``docker``, or
    one a plug-in registers under ``vfops.container_engines``)."""
    return (os.environ.get("VFOPS_SANDBOX_ENGINE") or DEFAULT_ENGINE).strip()


def max_containers() -> int:
    """``VFOPS_SANDBOX_MAX_CONTAINERS``: live sandbox containers on this host at most, all
    processes together (default :data:`DEFAULT_MAX_CONTAINERS`)."""
    raw = (os.environ.get("VFOPS_SANDBOX_MAX_CONTAINERS") or "").strip()
    if not raw:
        return DEFAULT_MAX_CONTAINERS
    if not raw.isdigit() or int(raw) < 1:
        raise VfopsError(
            f"VFOPS_SANDBOX_MAX_CONTAINERS must be a positive integer, not {raw!r}; fix or unset it"
        )
    return int(raw)


def lifetime_s() -> float:
    raw = (os.environ.get("VFOPS_SANDBOX_LIFETIME_S") or "").strip()
    if not raw:
        return DEFAULT_LIFETIME_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value < 10:
        raise VfopsError(
            f"VFOPS_SANDBOX_LIFETIME_S must be a number of seconds >= 10, not {raw!r}; "
            "fix or unset it"
        )
    return value
