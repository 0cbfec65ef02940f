"""Whose containers these are, and removing what a dead process left.

Every container carries :data:`OWNER_LABEL`: its owner process as
``<boot id>-<pid>-<start tick>`` (a pid alone is reused; a boot id tells a container of
the last boot's process from this one's). A process that starts a container leaves a
marker file named by its owner id in the host's state folder, and removes it when it
exits having removed its containers. So the start of any vfops command finds what a
killed process (``kill -9``, an out-of-memory kill, a lost machine) left by listing one
small folder — no engine call unless a marker's process is dead — and removes those
containers before it does anything else (:func:`reap_dead_owners`). ``vfops sandbox gc``
asks the engine itself, for containers whose marker is gone too.

Light on purpose: the CLI calls :func:`reap_dead_owners` at every start.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from vfops.sandbox._engine import ContainerEngine

SANDBOX_LABEL: Final = "vfops.sandbox"
OWNER_LABEL: Final = "vfops.owner"
RUN_LABEL: Final = "vfops.run"
ROLLOUT_LABEL: Final = "vfops.rollout"
POOL_LABEL: Final = "vfops.pool"

_lock = threading.Lock()
_live: dict[str, str] = {}
"""This process's live containers: id -> engine name."""
_marked: set[str] = set()
_used: dict[tuple[str, str], dict[str, Any]] = {}
"""(engine, image) -> limits: what this process's sandboxes ran on (a run's provenance)."""
_digests: dict[tuple[str, str], str | None] = {}


def state_dir() -> Path:
    """``VFOPS_SANDBOX_STATE_DIR``, else a folder per user in the temporary folder: the
    host's, not a vfops home's (containers are the host's, whatever home made them)."""
    raw = os.environ.get("VFOPS_SANDBOX_STATE_DIR")
    if raw:
        return Path(raw).expanduser()
    return Path(tempfile.gettempdir()) / f"vfops-sandbox-{os.getuid()}"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        return "noboot"


def _start_tick(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[19].decode()  # field 22 of proc_pid_stat(5)


def owner_id(pid: int | None = None) -> str:
    """The owner id of ``pid`` (this process by default)."""
    pid = os.getpid() if pid is None else pid
    return f"{_boot_id()}-{pid}-{_start_tick(pid) or 0}"


def container_labels(**extra: str) -> dict[str, str]:
    """The labels of a container this process starts now: vfops's mark, its owner, and
    the run and rollout of the current context (:mod:`vfops._rollout_scope`); ``extra``
    (``vfops.pool``...) on top."""
    from vfops._rollout_scope import current_scope

    scope = current_scope()
    labels = {SANDBOX_LABEL: "1", OWNER_LABEL: owner_id()}
    if scope.run is not None:
        labels[RUN_LABEL] = scope.run
    if scope.rollout is not None:
        labels[ROLLOUT_LABEL] = scope.rollout
    return {**labels, **extra}


def owner_alive(owner: str) -> bool:
    boot, _, rest = owner.partition("-")
    pid_text, _, tick = rest.partition("-")
    if boot != _boot_id() or not pid_text.isdigit():
        return False
    return _start_tick(int(pid_text)) == tick


def track_container(container: str, engine: str) -> None:
    """``container`` (of ``engine``) is live in this process: marked, removed at exit."""
    owner = owner_id()
    with _lock:
        _live[container] = engine
        if owner not in _marked:
            folder = state_dir() / "owners"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / owner).write_text(engine)
            _marked.add(owner)
            if len(_marked) == 1:
                atexit.register(remove_live_containers)


def note_sandbox_use(engine: str, image: str, limits: dict[str, Any]) -> None:
    """A container of ``image`` with ``limits`` was started on ``engine``."""
    with _lock:
        _used[(engine, image)] = limits


def sandboxes_used() -> list[dict[str, Any]]:
    """Each engine and image this process's sandboxes ran on, with the image's digest
    and the limits (the last started's): what a run records as its provenance. Empty
    (and no engine call) for a process that never started one."""
    from vfops.sandbox._engine import engine_named

    with _lock:
        used = dict(_used)
    found = []
    for (engine, image), limits in sorted(used.items()):
        digest = _digests.get((engine, image))
        if digest is None:  # asked once a process (a run records it at start and end)
            try:
                digest = _digests[(engine, image)] = engine_named(engine).image_digest(image)
            except Exception:  # recorded without it: the run's end is not the engine's
                digest = None
        found.append({"engine": engine, "image": image, "image_digest": digest,
                      "limits": limits})  # fmt: skip
    return found


def untrack_container(container: str) -> None:
    with _lock:
        _live.pop(container, None)


def remove_live_containers() -> None:
    """Remove every container this process still holds (a warm pool's, one a finally did
    not get to) and its owner marker: at interpreter exit, and before an ``os._exit``
    (``vfops eval`` skips the interpreter's teardown). Nothing to do, no engine call, for
    a process that never started one."""
    from vfops.sandbox._engine import engine_named

    with _lock:
        live = dict(_live)
        _live.clear()
    by_engine: dict[str, list[str]] = {}
    for container, engine in live.items():
        by_engine.setdefault(engine, []).append(container)
    for engine, containers in by_engine.items():
        with contextlib.suppress(Exception):
            engine_named(engine).remove_sync(containers)
    owner = owner_id()
    if owner in _marked:
        with contextlib.suppress(OSError):
            (state_dir() / "owners" / owner).unlink()


def reap_dead_owners(engine: ContainerEngine | None = None) -> list[str]:
    """Remove the containers of every marked owner that is no longer alive; their ids.

    A marker names its engine; ``engine`` replaces it (tests). A marker whose
    containers cannot be removed (the engine gone) stays for the next start."""
    folder = state_dir() / "owners"
    try:
        markers = list(folder.iterdir())
    except OSError:
        return []  # no process on this host ever started a container
    removed: list[str] = []
    for marker in markers:
        if owner_alive(marker.name):
            continue
        try:
            removed += _remove_owned(marker, engine)
        except Exception as exc:  # the command goes on; the next start tries again
            print(f"warning: sandbox containers of dead process {marker.name} were "
                  f"not removed ({exc}); run `vfops sandbox gc`", file=sys.stderr)  # fmt: skip
            continue
        with contextlib.suppress(OSError):
            marker.unlink()
    return removed


def _remove_owned(marker: Path, engine: ContainerEngine | None) -> list[str]:
    from vfops.sandbox._engine import engine_named

    if engine is None:
        engine = engine_named(marker.read_text().strip() or "podman")
    containers = engine.list_labelled(OWNER_LABEL, marker.name)
    engine.remove_sync(containers)
    return containers
