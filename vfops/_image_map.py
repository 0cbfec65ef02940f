"""Which local container image stands in for an image a task names (``--image-map``).

A v1 task names the image it runs in (``ghcr.io/org/box:1``); where no registry is
reachable, or a team builds its own, ``--image-map NAME=LOCAL`` (a sweep spec's
``image_map``) runs it in ``LOCAL`` instead. The map is part of what the run ran: it is
recorded with the run and set, as a context variable, around the environment's load and
its rollouts, where the container runtime reads it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar

from vfops._errors import InvalidArgumentError

__all__ = ["check_image_map", "current_image_map", "image_map_scope", "parse_image_map"]

_MAP: ContextVar[Mapping[str, str] | None] = ContextVar("vfops_image_map", default=None)


def parse_image_map(items: Iterable[str], flag: str = "--image-map") -> dict[str, str]:
    """``["NAME=LOCAL", ...]`` as a mapping; a malformed item is one line naming it."""
    found: dict[str, str] = {}
    for item in items:
        name, sep, local = item.partition("=")
        if not sep or not name.strip() or not local.strip():
            raise InvalidArgumentError(
                f"{flag} takes NAME=LOCAL (the image a task names = a local image), not {item!r}"
            )
        found[name.strip()] = local.strip()
    return found


def check_image_map(mapping: Mapping[str, str], where: str = "image_map") -> None:
    for name, local in mapping.items():
        if not isinstance(name, str) or not isinstance(local, str) or not name or not local:
            raise InvalidArgumentError(
                f"{where} maps image names to local image names (strings), not "
                f"{name!r} -> {local!r}"
            )


@contextlib.contextmanager
def image_map_scope(mapping: Mapping[str, str]) -> Iterator[None]:
    token = _MAP.set(dict(mapping))
    try:
        yield
    finally:
        _MAP.reset(token)


def current_image_map() -> Mapping[str, str]:
    return _MAP.get() or {}
