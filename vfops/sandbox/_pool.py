"""Warm containers: started ahead, handed out one per piece of work, never reused.

A container's start is most of a short command's latency (bench/sandbox_start.py). A
:class:`SandboxPool` keeps ``size`` containers started; :meth:`SandboxPool.sandbox`
hands one out as a :class:`Sandbox` (an environment uses it across the steps of one
rollout: files persist), and removes it afterwards — a container that ran a model's code
is never handed to another rollout — while a replacement starts in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

from vfops.sandbox._engine import ContainerEngine, ContainerSpec, SandboxError, resolve_engine
from vfops.sandbox._image import default_image
from vfops.sandbox._limits import DEFAULT_LIMITS, SandboxLimits
from vfops.sandbox._owners import POOL_LABEL, ROLLOUT_LABEL, container_labels
from vfops.sandbox._sandbox import Sandbox, start_container
from vfops.sandbox._settings import lifetime_s
from vfops.sandbox._slots import Slot, acquire_slot


class SandboxPool:
    """``size`` warm containers of one image and one set of limits."""

    def __init__(
        self,
        size: int = 2,
        *,
        image: str | None = None,
        limits: SandboxLimits | None = None,
        engine: ContainerEngine | str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if size < 0:
            raise SandboxError(f"a sandbox pool's size must be >= 0, not {size}")
        self.size = size
        self.engine = resolve_engine(engine)
        self.image = image or default_image()
        self.limits = limits or DEFAULT_LIMITS
        self.env = dict(env or {})
        self._warm: asyncio.Queue[tuple[str, Slot]] = asyncio.Queue()
        self._filling: set[asyncio.Task[None]] = set()
        self._closed = False

    async def __aenter__(self) -> SandboxPool:
        self.fill()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def warm(self) -> int:
        """Containers started and waiting to be handed out."""
        return self._warm.qsize()

    def fill(self) -> None:
        """Start containers in the background until ``size`` are warm or starting."""
        while not self._closed and self._warm.qsize() + len(self._filling) < self.size:
            task = asyncio.ensure_future(self._start_one())
            self._filling.add(task)
            task.add_done_callback(self._filling.discard)

    async def _start_one(self) -> None:
        slot = await acquire_slot()
        # no rollout yet: a warm container is handed to one later (its run is known now)
        labels = container_labels(**{POOL_LABEL: "1"})
        labels.pop(ROLLOUT_LABEL, None)
        spec = ContainerSpec(self.image, self.limits, labels, lifetime_s(), self.env)
        try:
            container = await start_container(self.engine, spec)
        except Exception:
            # a warm start is a head start, no more: the sandbox that would have had it
            # starts its own and raises the engine's error where a rollout records it
            await slot.release()
            return
        except BaseException:
            await slot.release()
            raise
        if self._closed:
            await self.engine.remove([container])
            await slot.release()
            return
        self._warm.put_nowait((container, slot))

    @contextlib.asynccontextmanager
    async def sandbox(self) -> AsyncIterator[Sandbox]:
        """A warm container as a :class:`Sandbox` (a cold one if none is warm yet)."""
        box = Sandbox(image=self.image, limits=self.limits, engine=self.engine, env=self.env)
        try:
            container, slot = self._warm.get_nowait()
        except asyncio.QueueEmpty:
            pass  # the sandbox starts its own on first use
        else:
            await box.adopt(container, slot)
        self.fill()
        try:
            yield box
        finally:
            await box.close()

    async def close(self) -> None:
        self._closed = True
        for task in list(self._filling):
            task.cancel()
        await asyncio.gather(*self._filling, return_exceptions=True)
        warm: list[tuple[str, Slot]] = []
        while not self._warm.empty():
            warm.append(self._warm.get_nowait())
        try:
            await asyncio.shield(self.engine.remove([c for c, _ in warm]))
        finally:
            for _, slot in warm:
                await slot.release()
