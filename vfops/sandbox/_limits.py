"""What one sandbox may use, and the host-wide settings of the sandboxes."""

from __future__ import annotations

import os
from typing import Final

from pydantic import Field

from vfops._config import ConfigModel
from vfops._errors import VfopsError


class SandboxLimits(ConfigModel):
    """Limits of one container. Every field is enforced by the container engine (cgroups,
    a size-capped tmpfs, no network namespace) or, for wall time and output, by vfops
    reading the container's output: the code inside cannot lift any of them."""

    cpus: float = Field(
        default=1.0, gt=0, description="CPU cores the container may use (a CFS quota)."
    )
    memory_mb: int = Field(
        default=512, ge=16, description="Memory in MiB, swap included; past it the kernel kills."
    )
    pids: int = Field(
        default=64, ge=4, description="Processes and threads at most (a fork bomb stops)."
    )
    wall_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds one command may run; then it is killed (timed_out).",
    )
    output_bytes: int = Field(
        default=1_000_000,
        ge=1024,
        description="Bytes of stdout and stderr kept; past them the command is ended "
        "(output_truncated).",
    )
    scratch_mb: int = Field(
        default=64,
        ge=1,
        description="Size of the writable scratch folder (/scratch, a tmpfs) in MiB.",
    )
    network: bool = Field(
        default=False, description="Give the container a network (off: no interface but loopback)."
    )


DEFAULT_LIMITS: Final = SandboxLimits()

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
