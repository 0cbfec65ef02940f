"""v1 tasks that need a container, run in one through ``verifiers``' own runtimes.

A task that names an image (``TaskData.image``) or whose class sets ``NEEDS_CONTAINER``
runs with ``verifiers``' Podman or Docker runtime — whichever ``VFOPS_SANDBOX_ENGINE``
names — exactly as ``vf-eval --env.agent.runtime.type podman`` runs it: the runtime
starts the task's container, the task's setup, rewards and metrics that take a
``runtime`` run their commands in it, and it is removed at the episode's end. What vfops
adds:

- the image a task names is replaced by a local one where ``--image-map NAME=LOCAL``
  says so (no registry needs to be reachable), and a task whose image is not on the host
  is refused in one line before anything starts (never pulled at run time);
- each container carries vfops's labels (owner process, run, rollout), so one that a
  killed eval left is removed at the next vfops start like any sandbox's
  (:mod:`vfops.sandbox`), and is removed at interpreter exit if an episode did not;
- each row records its runtime, image (declared and run), the image's digest and the
  limits the task asks for.
"""

from __future__ import annotations

import functools
from typing import Any, Final

from vfops._errors import VfopsError
from vfops._image_map import current_image_map
from vfops.sandbox import engine_name, engine_named

_ENGINES: Final = ("podman", "docker")
"""The engines ``verifiers`` has runtimes for that vfops drives (its CLI ones)."""
_DEFAULT_IMAGE: Final = "docker.io/library/python:3.11-slim"
"""``verifiers``' Podman/Docker runtime image for a task that names none."""


def needs_container(task: Any) -> bool:
    return bool(getattr(type(task), "NEEDS_CONTAINER", False) or task.data.image)


def container_engine(where: str) -> str:
    """The engine a container task runs on; refused unless ``verifiers`` has a runtime
    for it."""
    name = engine_name()
    if name not in _ENGINES:
        raise VfopsError(
            f"{where} needs a container and VFOPS_SANDBOX_ENGINE is {name!r}; v1 tasks run "
            f"on verifiers' own runtimes: set it to podman or docker"
        )
    return name


def place_in_container(task: Any, where: str) -> dict[str, Any]:
    """Point ``task`` at the local image it runs in (``--image-map``), checked to be on
    the host; what its row records about its container."""
    engine = container_engine(where)
    declared = task.data.image or _DEFAULT_IMAGE
    image = current_image_map().get(declared, declared)
    digest = _digest(engine, image)
    if digest is None:
        mapped = f" (mapped from {declared!r})" if image != declared else ""
        raise VfopsError(
            f"{where} needs image {image!r}{mapped}, which is not on this host ({engine}); "
            f"build or load it, or run it in a local image with --image-map {declared}=LOCAL"
        )
    if task.data.image != image:
        task.data = task.data.model_copy(update={"image": image})
    resources = task.data.resources.model_dump(exclude_none=True)
    return {
        "runtime": engine,
        "image": image,
        "declared_image": declared,
        "image_digest": digest,
        "limits": resources,
    }


@functools.cache
def _digest(engine: str, image: str) -> str | None:
    return engine_named(engine).image_digest(image)


def install_labelled_runtimes() -> None:
    """Make ``verifiers``' Podman and Docker runtimes label their containers as vfops's
    sandboxes are labelled (owner, run, rollout), never pull at run time, and hand what
    they start to vfops's removal at exit (once per process)."""
    import verifiers.v1.runtimes as runtimes

    if getattr(runtimes, "_vfops_labelled", False):
        return
    runtimes.DockerRuntime = _labelled(runtimes.DockerRuntime)
    runtimes.PodmanRuntime = _labelled(runtimes.PodmanRuntime)
    runtimes._vfops_labelled = True


def _labelled(base: type) -> type:
    from vfops.sandbox import (
        container_labels,
        note_sandbox_use,
        track_container,
        untrack_container,
    )

    class Labelled(base):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            for key, value in container_labels().items():
                self._label_args += ["--label", f"{key}={value}"]
            # never a pull at run time; removal without the 10 s stop grace (its main
            # process, sleep, ignores SIGTERM): the runtime removes it synchronously
            self._label_args += ["--pull", "never", "--stop-timeout", "1"]

        async def start(self) -> None:
            try:
                await super().start()
            finally:
                if getattr(self, "_container", None):
                    track_container(self._container, self.engine)
            note_sandbox_use(
                self.engine, self.config.image, self.config.model_dump(exclude={"type"})
            )

        def cleanup(self) -> None:
            try:
                super().cleanup()
            finally:
                if getattr(self, "_container", None):
                    untrack_container(self._container)

    Labelled.__name__ = Labelled.__qualname__ = base.__name__
    return Labelled
