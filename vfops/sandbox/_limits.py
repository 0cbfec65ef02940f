"""What one sandbox may use."""

from __future__ import annotations

from typing import Final

from pydantic import Field

from vfops._config import ConfigModel


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
