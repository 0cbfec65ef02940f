"""The sandbox tests' shared set-up: the engine, the one base image, and what to look at.

The base image is built once per machine (`vfops sandbox build-image`, which `make test`
runs first; building it here too when missing, ~45 s); every test uses it.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable

import pytest

from vfops.sandbox import build_base_image, engine_named


@pytest.fixture(scope="session")
def base_image() -> str:
    image, _ = build_base_image(engine_named("podman"))
    return image


def containers(label: str, value: str | None = None) -> list[str]:
    """Ids of podman containers carrying ``label`` (``=value``), running or not."""
    selector = label if value is None else f"{label}={value}"
    done = subprocess.run(
        ["podman", "ps", "--all", "--quiet", "--filter", f"label={selector}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


async def until(condition: Callable[[], object], deadline_s: float = 60.0) -> None:
    """Return once ``condition()`` holds (a state another task or process reaches);
    fail past ``deadline_s``, a bound far above any wait it stands for."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, "the awaited state never came"
        await asyncio.sleep(0.05)
