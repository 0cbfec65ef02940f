"""One sandbox: a fresh container with limits, commands run in it, files in and out.

A :class:`Sandbox` starts its container on first use (or is handed a warm one by a
:class:`~vfops.sandbox.SandboxPool`) and removes it when closed, whatever ends it: a
normal exit, an exception, a cancellation (Ctrl-C, SIGTERM: the eval cancels its
rollouts), interpreter exit; a ``kill -9`` is cleaned by the next vfops start
(:mod:`vfops.sandbox._owners`). Files persist between commands of one sandbox, so a
tool environment can use one sandbox per rollout across its turns.

What the code does is a result, never an exception: a non-zero exit, a command past its
wall time (``timed_out``: killed), output past its limit (``output_truncated``: ended).
After a time or output limit the container is removed (what ran may still run) and the
next command starts a fresh one (``fresh_container`` says so). An exception
(:class:`SandboxError`) is the engine's failure, which an environment must not score.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shlex
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from types import TracebackType
from typing import Final, Self

from vfops.sandbox._engine import ContainerEngine, ContainerSpec, SandboxError, resolve_engine
from vfops.sandbox._image import default_image
from vfops.sandbox._limits import DEFAULT_LIMITS, SandboxLimits
from vfops.sandbox._owners import (
    container_labels,
    note_sandbox_use,
    track_container,
    untrack_container,
)
from vfops.sandbox._settings import lifetime_s
from vfops.sandbox._slots import Slot, acquire_slot

_KILL_GRACE_S: Final = 1
"""Seconds between ``timeout``'s TERM and its KILL of a command past its wall time."""
_DEADLINE_MARGIN_S: Final = 10.0
"""The host's own deadline past a command's wall time: only a hung engine meets it."""
_FILES_OUT_BYTES: Final = 64 * 1024 * 1024


@dataclass
class ExecResult:
    """What one command gave. ``exit_code`` is None when it was ended by vfops (its
    output past the limit) or by the host's deadline."""

    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    output_truncated: bool = False
    fresh_container: bool = False
    """The command ran in a new container: an earlier limit ended the previous one, and
    files written before it are gone."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_truncated

    @property
    def killed(self) -> bool:
        """Killed by the kernel (SIGKILL: the memory limit, mostly) without timing out."""
        return self.exit_code in (137, -9) and not self.timed_out

    def describe(self) -> str:
        """One line for a model or a log: how the command ended."""
        if self.timed_out:
            return f"timed out after {self.duration_s:.1f} s (killed)"
        if self.output_truncated:
            return "output past the sandbox's limit: the command was ended"
        if self.killed:
            return "killed (out of memory, or past a limit)"
        return f"exit code {self.exit_code}"


class Sandbox:
    """A container for one piece of work; ``async with Sandbox() as box: await box.run(...)``."""

    def __init__(
        self,
        *,
        image: str | None = None,
        limits: SandboxLimits | None = None,
        engine: ContainerEngine | str | None = None,
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self.engine = resolve_engine(engine)
        self.image = image or default_image()
        self.limits = limits or DEFAULT_LIMITS
        # only what the caller names: the host's environment (API keys) never goes in
        self.env = dict(env or {})
        self._labels = dict(labels or {})
        self._container: str | None = None
        self._slot: Slot | None = None
        self._ended_by_limit = False
        self._closed = False
        self._start_lock = asyncio.Lock()

    @property
    def container(self) -> str | None:
        return self._container

    def labels(self) -> dict[str, str]:
        return container_labels(**self._labels)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> str:
        """Start the container now (else the first command does); its id."""
        async with self._start_lock:
            if self._closed:
                raise SandboxError("this sandbox is closed; open a new one")
            if self._container is None:
                await self._start()
            assert self._container is not None
            return self._container

    async def _start(self) -> None:
        slot = await acquire_slot()
        spec = ContainerSpec(
            image=self.image,
            limits=self.limits,
            labels=self.labels(),
            lifetime_s=lifetime_s(),
            env=self.env,
        )
        try:
            container = await start_container(self.engine, spec)
        except BaseException:
            await slot.release()
            raise
        self._container, self._slot = container, slot

    async def adopt(self, container: str, slot: Slot) -> None:
        """Use a container a pool started (and its slot) instead of starting one."""
        self._container, self._slot = container, slot

    async def close(self) -> None:
        """Remove the container (shielded: a cancelled rollout still removes it)."""
        self._closed = True
        await asyncio.shield(self._end())

    async def _end(self) -> None:
        container, slot = self._container, self._slot
        self._container = self._slot = None
        try:
            if container is not None:
                await self.engine.remove([container])
                untrack_container(container)
        finally:
            if slot is not None:
                await slot.release()

    async def run(
        self,
        command: str | Sequence[str],
        *,
        stdin: bytes | str | None = None,
        files: Mapping[str, bytes | str] | None = None,
        wall_s: float | None = None,
    ) -> ExecResult:
        """Run ``command`` (a shell line, or an argv) in the scratch folder."""
        fresh = self._ended_by_limit
        self._ended_by_limit = False
        container = await self.start()
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        wall = self.limits.wall_s if wall_s is None else wall_s
        # timeout: TERM at the wall time, KILL a second later; its group, not only the
        # command (a shell's children too)
        argv = ["timeout", "-k", str(_KILL_GRACE_S), f"{wall:g}", *argv]
        data = stdin.encode() if isinstance(stdin, str) else stdin
        if files and data is None:
            # one exec, not two: the files arrive as a tar on stdin, unpacked first
            data = _archive(files)
            argv = ["sh", "-c", 'tar -x -f - --no-same-owner && exec "$@"', "sh", *argv]
        elif files:
            await self.put_files(files)
        began = time.monotonic()
        outcome = await self.engine.exec(
            container,
            argv,
            stdin=data,
            output_bytes=self.limits.output_bytes,
            deadline_s=wall + _KILL_GRACE_S + _DEADLINE_MARGIN_S,
        )
        duration = time.monotonic() - began
        timed_out = outcome.deadline_passed or (
            outcome.exit_code in (124, 137) and duration >= wall
        )
        if outcome.deadline_passed or outcome.output_truncated or timed_out:
            # what ran may still run (a background child, a writer blocked on its pipe)
            await self._end()
            self._ended_by_limit = True
        return ExecResult(
            exit_code=None if outcome.deadline_passed else outcome.exit_code,
            stdout=outcome.stdout.decode(errors="replace"),
            stderr=outcome.stderr.decode(errors="replace"),
            duration_s=duration,
            timed_out=timed_out,
            output_truncated=outcome.output_truncated,
            fresh_container=fresh,
        )

    async def run_python(
        self,
        code: str,
        *,
        stdin: bytes | str | None = None,
        files: Mapping[str, bytes | str] | None = None,
        wall_s: float | None = None,
    ) -> ExecResult:
        """Run ``code`` with the container's ``python3`` (written to a file first: no
        quoting, any size)."""
        name = f".vfops-code-{os.urandom(4).hex()}.py"
        return await self.run(
            ["python3", name], stdin=stdin, files={**(files or {}), name: code}, wall_s=wall_s
        )

    async def put_files(self, files: Mapping[str, bytes | str]) -> None:
        """Write ``files`` (relative paths -> contents) into the scratch folder."""
        archive = _archive(files)
        container = await self.start()
        outcome = await self.engine.exec(
            container,
            ["tar", "-x", "-f", "-", "--no-same-owner"],
            stdin=archive,
            output_bytes=65536,
            deadline_s=_DEADLINE_MARGIN_S + 30,
        )
        if outcome.exit_code != 0:
            reason = outcome.stderr.decode(errors="replace").strip()[-300:]
            raise SandboxError(f"could not write files into the sandbox: {reason}")

    async def get_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        """The named files of the scratch folder (missing ones are left out)."""
        container = await self.start()
        names = [_relative(path) for path in paths]
        listing = " ".join(shlex.quote(name) for name in names)
        outcome = await self.engine.exec(
            container,
            # only regular files that exist: tar stops at nothing missing
            ["sh", "-c", f"for f in {listing}; do [ -f \"$f\" ] && printf '%s\\0' \"$f\"; "
             "done | tar -c -f - --null -T -"],
            stdin=None,
            output_bytes=_FILES_OUT_BYTES,
            deadline_s=_DEADLINE_MARGIN_S + 30,
        )  # fmt: skip
        if outcome.output_truncated:
            raise SandboxError("files read from the sandbox are past 64 MiB; read fewer")
        found: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(outcome.stdout), mode="r") as tar:
            for member in tar.getmembers():
                handle = tar.extractfile(member) if member.isfile() else None
                if handle is not None:
                    found[member.name] = handle.read()
        return found


async def start_container(engine: ContainerEngine, spec: ContainerSpec) -> str:
    """Start a container, tracked for removal at exit; a cancellation while it starts
    waits for the start and removes what it made (else it would outlive everything)."""
    started = asyncio.ensure_future(engine.start(spec))
    try:
        container = await asyncio.shield(started)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await engine.remove([await started])
        raise
    track_container(container, engine.name)
    note_sandbox_use(engine.name, spec.image, spec.limits.model_dump())
    return container


def _archive(files: Mapping[str, bytes | str]) -> bytes:
    """``files`` as an uncompressed tar (names checked: relative, inside the scratch)."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            member = tarfile.TarInfo(_relative(name))
            member.size, member.mode, member.mtime = len(data), 0o644, int(time.time())
            tar.addfile(member, io.BytesIO(data))
    return archive.getvalue()


def _relative(name: str) -> str:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise SandboxError(
            f"sandbox file name {name!r} must be a relative path inside the scratch folder"
        )
    return str(path)


async def run_in_sandbox(
    command: str | Sequence[str],
    *,
    files: Mapping[str, bytes | str] | None = None,
    stdin: bytes | str | None = None,
    limits: SandboxLimits | None = None,
    image: str | None = None,
) -> ExecResult:
    """Run one command in a fresh container, removed before this returns."""
    async with Sandbox(image=image, limits=limits) as box:
        return await box.run(command, files=files, stdin=stdin)
