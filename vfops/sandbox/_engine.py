"""The container engine seam: a small protocol, and the engines that speak Docker's CLI.

An engine starts a container from a :class:`ContainerSpec`, runs commands in it, lists
and removes containers by label, and names an image's digest. Podman and Docker take the
same command lines for all of that, so one class drives both (:class:`CliEngine`); an
engine for something else (a Kubernetes pod per sandbox, a hosted sandbox service) is a
class with the same methods, registered under the ``vfops.container_engines`` entry-point
group and chosen by name with ``VFOPS_SANDBOX_ENGINE`` — the built-in ones are found the
same way (pyproject.toml).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

from vfops._errors import SandboxError

if TYPE_CHECKING:
    from vfops.sandbox._limits import SandboxLimits

__all__ = [
    "DOCKER",
    "ENGINE_GROUP",
    "PODMAN",
    "SCRATCH",
    "CliEngine",
    "ContainerEngine",
    "ContainerSpec",
    "ExecOutcome",
    "SandboxError",
    "engine_named",
]

ENGINE_GROUP: Final = "vfops.container_engines"
SCRATCH: Final = "/scratch"
"""The container's writable folder (a size-capped tmpfs) and its working directory."""
_REMOVE_ATTEMPTS: Final = 3
_REMOVE_RETRY_S: Final = 0.5
"""A removal is tried again: podman's ``rm`` sometimes reports a container's processes
"did not die within timeout" while a killed exec session is still being torn down."""
_ENGINE_GONE_S: Final = 30.0
"""How long the engine's client may take to go once its container is removed."""


@dataclass(frozen=True)
class ContainerSpec:
    """One container to start: its image, limits, labels and main process's lifetime."""

    image: str
    limits: SandboxLimits
    labels: Mapping[str, str]
    lifetime_s: float
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass
class ExecOutcome:
    """What one command in a container gave, as the engine saw it."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    output_truncated: bool = False
    deadline_passed: bool = False


@runtime_checkable
class ContainerEngine(Protocol):
    name: str

    async def start(self, spec: ContainerSpec) -> str:
        """Start a container (its main process idles) and return its id."""
        ...

    async def exec(
        self,
        container: str,
        argv: Sequence[str],
        *,
        stdin: bytes | None,
        output_bytes: int,
        deadline_s: float,
    ) -> ExecOutcome:
        """Run ``argv`` in ``container`` (in :data:`SCRATCH`), keeping at most
        ``output_bytes`` of output; past them, or past ``deadline_s``, remove the
        container (what ran there may still run) and say so."""
        ...

    async def remove(self, containers: Sequence[str]) -> None:
        """Kill and remove; a container already gone is not an error."""
        ...

    def remove_sync(self, containers: Sequence[str]) -> None:
        """:meth:`remove` without an event loop (interpreter exit, a new process's start)."""
        ...

    def list_labelled(self, label: str, value: str | None = None) -> list[str]:
        """Ids of every container (running or not) carrying ``label`` (``=value``)."""
        ...

    def image_digest(self, image: str) -> str | None:
        """The image's id (``sha256:...``), or None when the engine does not have it."""
        ...


class CliEngine:
    """Drives a Docker-compatible CLI (``podman``, ``docker``) as subprocesses."""

    def __init__(self, name: str, binary: str | None = None) -> None:
        self.name = name
        self.binary = binary or name

    def _path(self) -> str:
        found = shutil.which(self.binary)
        if found is None:
            raise SandboxError(
                f"container engine '{self.binary}' is not installed; install it (Debian: "
                "apt-get install -y podman runc) or set VFOPS_SANDBOX_ENGINE to one that is"
            )
        return found

    def run_args(self, spec: ContainerSpec) -> list[str]:
        """The ``run`` command line for ``spec`` (public: tests read what is asked)."""
        limits = spec.limits
        args = [
            # never a pull at run time: the image is built or loaded beforehand
            "run", "--detach", "--rm", "--pull", "never",
            "--network", "bridge" if limits.network else "none",
            # a read-only root; the only writable places are size-capped tmpfs mounts
            "--read-only", "--read-only-tmpfs=false",
            "--tmpfs", f"{SCRATCH}:rw,exec,size={limits.scratch_mb}m,mode=1777",
            "--tmpfs", "/tmp:rw,size=16m,mode=1777",
            "--memory", f"{limits.memory_mb}m", "--memory-swap", f"{limits.memory_mb}m",
            "--cpus", f"{limits.cpus:g}",
            "--pids-limit", str(limits.pids),
            # an unprivileged user with no capabilities, who cannot gain any
            "--user", "65534:65534", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges",
            "--workdir", SCRATCH,
            "--env", f"HOME={SCRATCH}",
        ]  # fmt: skip
        for key, value in sorted(spec.env.items()):
            args += ["--env", f"{key}={value}"]
        for key, value in sorted(spec.labels.items()):
            args += ["--label", f"{key}={value}"]
        # sleep as the main process: the container ends itself after its lifetime even
        # if its owner died and nothing has removed it yet
        return [*args, spec.image, "sleep", str(int(spec.lifetime_s))]

    async def start(self, spec: ContainerSpec) -> str:
        process = await asyncio.create_subprocess_exec(
            self._path(),
            *self.run_args(spec),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await process.communicate()
        if process.returncode != 0:
            raise SandboxError(_engine_failure(self.binary, "run", err, spec.image))
        return out.decode().strip().splitlines()[-1]

    async def exec(
        self,
        container: str,
        argv: Sequence[str],
        *,
        stdin: bytes | None,
        output_bytes: int,
        deadline_s: float,
    ) -> ExecOutcome:
        loop = asyncio.get_running_loop()
        budget = _Budget(output_bytes)
        transport, protocol = await loop.subprocess_exec(
            lambda: _ExecProtocol(loop, budget),
            self._path(), "exec", "--interactive", "--workdir", SCRATCH, container, *argv,
        )  # fmt: skip
        try:
            feed = transport.get_pipe_transport(0)
            if isinstance(feed, asyncio.WriteTransport):
                if stdin:
                    feed.write(stdin)
                feed.close()
            deadline_passed = False
            try:
                async with asyncio.timeout(deadline_s):
                    await protocol.settled.wait()
            except TimeoutError:
                deadline_passed = True
            if not protocol.finished.is_set():
                # past the output limit or the deadline: what ran there may still run,
                # and the container holds the other end of the client's pipes
                transport.kill()
                await self.remove([container])
                async with asyncio.timeout(_ENGINE_GONE_S):
                    await protocol.finished.wait()
        finally:
            transport.close()
        code = transport.get_returncode()
        return ExecOutcome(
            exit_code=None if budget.over or deadline_passed else code,
            stdout=bytes(budget.stdout),
            stderr=bytes(budget.stderr),
            output_truncated=budget.over,
            deadline_passed=deadline_passed,
        )

    async def remove(self, containers: Sequence[str]) -> None:
        for attempt in range(_REMOVE_ATTEMPTS):
            if not containers:
                return
            process = await asyncio.create_subprocess_exec(
                *self._rm_args(containers),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            _, err = await process.communicate()
            if process.returncode == 0:
                return
            if attempt + 1 == _REMOVE_ATTEMPTS:
                raise SandboxError(_engine_failure(self.binary, "rm", err, None))
            await asyncio.sleep(_REMOVE_RETRY_S * (attempt + 1))

    def remove_sync(self, containers: Sequence[str]) -> None:
        for attempt in range(_REMOVE_ATTEMPTS):
            if not containers:
                return
            done = subprocess.run(self._rm_args(containers), capture_output=True, check=False)
            if done.returncode == 0:
                return
            if attempt + 1 == _REMOVE_ATTEMPTS:
                raise SandboxError(_engine_failure(self.binary, "rm", done.stderr, None))
            time.sleep(_REMOVE_RETRY_S * (attempt + 1))

    def _rm_args(self, containers: Sequence[str]) -> list[str]:
        return [self._path(), "rm", "--force", "--time", "0", "--ignore", *containers]

    def list_labelled(self, label: str, value: str | None = None) -> list[str]:
        selector = label if value is None else f"{label}={value}"
        done = subprocess.run(
            [self._path(), "ps", "--all", "--quiet", "--no-trunc", "--filter",
             f"label={selector}"],
            capture_output=True,
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise SandboxError(_engine_failure(self.binary, "ps", done.stderr, None))
        return done.stdout.decode().split()

    def labels_of(self, containers: Sequence[str]) -> dict[str, dict[str, str]]:
        """Each container's labels (``vfops sandbox gc`` says whose run it removes)."""
        if not containers:
            return {}
        done = subprocess.run(
            [self._path(), "inspect", "--format", "{{.Id}} {{json .Config.Labels}}",
             *containers],
            capture_output=True,
            check=False,
        )  # fmt: skip
        import json

        found: dict[str, dict[str, str]] = {}
        for line in done.stdout.decode().splitlines():
            ident, _, labels = line.partition(" ")
            try:
                found[ident] = dict(json.loads(labels) or {})
            except ValueError:
                found[ident] = {}
        return found

    def image_digest(self, image: str) -> str | None:
        done = subprocess.run(
            [self._path(), "image", "inspect", "--format", "{{.Id}}", image],
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            return None
        ident = done.stdout.decode().strip()
        return ident if ident.startswith("sha256:") else f"sha256:{ident}"


class _Budget:
    """Output bytes kept so far, stdout and stderr together."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.over = False

    def take(self, into: bytearray, chunk: bytes) -> bool:
        room = self.limit - len(self.stdout) - len(self.stderr)
        into += chunk[: max(room, 0)]
        if len(chunk) > room:
            self.over = True
        return not self.over


class _ExecProtocol(asyncio.SubprocessProtocol):
    """Collects a command's output into its budget; ``settled`` when it finished or went
    past the budget, ``finished`` when the client exited and its pipes closed."""

    def __init__(self, loop: asyncio.AbstractEventLoop, budget: _Budget) -> None:
        self.budget = budget
        self.settled = asyncio.Event()
        self.finished = asyncio.Event()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        into = self.budget.stdout if fd == 1 else self.budget.stderr
        if not self.budget.take(into, data):
            self.settled.set()  # past the limit: nothing more is kept (a gigabyte never is)

    def connection_lost(self, exc: Exception | None) -> None:
        self.finished.set()
        self.settled.set()


def _engine_failure(binary: str, verb: str, stderr: bytes, image: str | None) -> str:
    reason = " ".join(stderr.decode(errors="replace").split())[-400:] or "no message"
    if image is not None and ("image not known" in reason or "No such image" in reason):
        return (
            f"container image '{image}' is not on this host ({binary}); build it with "
            "`vfops sandbox build-image` or set VFOPS_SANDBOX_IMAGE to one that is"
        )
    return f"{binary} {verb} failed: {reason}; check the engine (`{binary} info`)"


def resolve_engine(engine: ContainerEngine | str | None) -> ContainerEngine:
    """``engine`` itself, the one registered under a name, or the configured one."""
    if engine is None or isinstance(engine, str):
        from vfops.sandbox._settings import engine_name

        return engine_named(engine or engine_name())
    return engine


def engine_named(name: str) -> ContainerEngine:
    """The engine registered under ``name`` in :data:`ENGINE_GROUP`."""
    found = {ep.name: ep for ep in entry_points(group=ENGINE_GROUP)}
    ep = found.get(name)
    if ep is None:
        known = ", ".join(sorted(found)) or "none"
        raise SandboxError(
            f"unknown container engine '{name}' (VFOPS_SANDBOX_ENGINE); installed: {known}"
        )
    engine = ep.load()
    if not isinstance(engine, ContainerEngine):
        raise SandboxError(f"container engine '{name}' ({ep.value}) lacks the engine's methods")
    return engine


PODMAN: Final = CliEngine("podman")
DOCKER: Final = CliEngine("docker")
