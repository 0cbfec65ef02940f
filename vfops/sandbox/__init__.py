"""Sandboxes: code a model wrote runs in a fresh container, never on the host.

A container engine (podman here, Docker elsewhere; ``VFOPS_SANDBOX_ENGINE``, a plug-in
under ``vfops.container_engines`` for anything else) runs each :class:`Sandbox` with no
network (unless asked), limits on CPU, memory, processes, wall time, output and scratch
space, a read-only root, an unprivileged user without capabilities, and none of the
host's environment variables. Containers carry labels naming their owner process, run
and rollout; none outlives its owner for long: removed when the sandbox closes, at exit,
and — after a ``kill -9`` — at the next vfops start on the host (``vfops sandbox gc``
on demand). At most ``VFOPS_SANDBOX_MAX_CONTAINERS`` live on a host at once.

- :class:`Sandbox`, :func:`run_in_sandbox`: one container, commands and files.
- :class:`SandboxPool`: warm containers, one per piece of work.
- :class:`FleetGate`, :func:`fleet_gate_scope`: a limit across machines (a sweep's
  Prefect global concurrency limit) on top of the host's.
- :class:`SandboxLimits`, :class:`ExecResult`, :class:`SandboxError`.
- :func:`build_base_image`, :func:`default_image`: the Debian + python3 base image.
- :func:`collect_garbage`, :func:`reap_dead_owners`: what dead processes left;
  :func:`track_container`, :func:`untrack_container`, :func:`note_sandbox_use`: a
  container another library's runtime starts, handed to the same cleanup and record.
- :class:`ContainerEngine`, :class:`CliEngine`, :func:`engine_named`: the engine seam.

Importing this package is cheap (the CLI reaps at every start); the rest loads on use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vfops._lazy import lazy_exports

if TYPE_CHECKING:
    from vfops.sandbox._engine import (
        CliEngine,
        ContainerEngine,
        ContainerSpec,
        ExecOutcome,
        SandboxError,
        engine_named,
    )
    from vfops.sandbox._gc import GcReport, Removed, collect_garbage
    from vfops.sandbox._image import build_base_image, default_image
    from vfops.sandbox._limits import SandboxLimits
    from vfops.sandbox._owners import (
        OWNER_LABEL,
        ROLLOUT_LABEL,
        RUN_LABEL,
        SANDBOX_LABEL,
        container_labels,
        note_sandbox_use,
        owner_id,
        reap_dead_owners,
        remove_live_containers,
        sandboxes_used,
        track_container,
        untrack_container,
    )
    from vfops.sandbox._pool import SandboxPool
    from vfops.sandbox._sandbox import ExecResult, Sandbox, run_in_sandbox
    from vfops.sandbox._settings import engine_name, max_containers
    from vfops.sandbox._slots import FleetGate, fleet_gate_scope

_EXPORTS = {
    "CliEngine": "vfops.sandbox._engine",
    "ContainerEngine": "vfops.sandbox._engine",
    "ContainerSpec": "vfops.sandbox._engine",
    "ExecOutcome": "vfops.sandbox._engine",
    "SandboxError": "vfops.sandbox._engine",
    "engine_named": "vfops.sandbox._engine",
    "GcReport": "vfops.sandbox._gc",
    "Removed": "vfops.sandbox._gc",
    "collect_garbage": "vfops.sandbox._gc",
    "build_base_image": "vfops.sandbox._image",
    "default_image": "vfops.sandbox._image",
    "SandboxLimits": "vfops.sandbox._limits",
    "engine_name": "vfops.sandbox._settings",
    "max_containers": "vfops.sandbox._settings",
    "OWNER_LABEL": "vfops.sandbox._owners",
    "ROLLOUT_LABEL": "vfops.sandbox._owners",
    "RUN_LABEL": "vfops.sandbox._owners",
    "SANDBOX_LABEL": "vfops.sandbox._owners",
    "owner_id": "vfops.sandbox._owners",
    "container_labels": "vfops.sandbox._owners",
    "note_sandbox_use": "vfops.sandbox._owners",
    "track_container": "vfops.sandbox._owners",
    "untrack_container": "vfops.sandbox._owners",
    "reap_dead_owners": "vfops.sandbox._owners",
    "sandboxes_used": "vfops.sandbox._owners",
    "remove_live_containers": "vfops.sandbox._owners",
    "SandboxPool": "vfops.sandbox._pool",
    "ExecResult": "vfops.sandbox._sandbox",
    "Sandbox": "vfops.sandbox._sandbox",
    "run_in_sandbox": "vfops.sandbox._sandbox",
    "FleetGate": "vfops.sandbox._slots",
    "fleet_gate_scope": "vfops.sandbox._slots",
}

__all__ = [
    "OWNER_LABEL",
    "ROLLOUT_LABEL",
    "RUN_LABEL",
    "SANDBOX_LABEL",
    "CliEngine",
    "ContainerEngine",
    "ContainerSpec",
    "ExecOutcome",
    "ExecResult",
    "FleetGate",
    "GcReport",
    "Removed",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxPool",
    "build_base_image",
    "collect_garbage",
    "container_labels",
    "default_image",
    "engine_name",
    "engine_named",
    "fleet_gate_scope",
    "max_containers",
    "note_sandbox_use",
    "owner_id",
    "reap_dead_owners",
    "remove_live_containers",
    "run_in_sandbox",
    "sandboxes_used",
    "track_container",
    "untrack_container",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
