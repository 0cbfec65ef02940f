"""Run a registered model version in this process (CPU), for gates and sweeps.

``models:/NAME@ALIAS`` is resolved to its version *once*, here: whoever uses the
returned client keeps evaluating that version even if the alias moves meanwhile,
and records the pinned ``models:/NAME/VERSION`` as the run's model.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vfops.checkpoints._registered import ModelVersionInfo, load_model_dir, resolve_version

if TYPE_CHECKING:
    from vfops.local import LocalModelClient

MODEL_URI_PREFIX = "models:/"


def is_model_uri(value: str) -> bool:
    """``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``."""
    return value.strip().startswith(MODEL_URI_PREFIX)


def generation_cap(model_dir: Path, default: int = 64) -> int:
    """The checkpoint's own ``max_new_tokens`` (generation_config.json), else ``default``."""
    try:
        data = json.loads((model_dir / "generation_config.json").read_text())
    except (OSError, ValueError):
        return default
    value = data.get("max_new_tokens") if isinstance(data, dict) else None
    return int(value) if isinstance(value, int) and value > 0 else default


def pin_model_uri(uri: str) -> ModelVersionInfo:
    """The version ``uri`` names now (an alias is resolved at this moment)."""
    return resolve_version(uri)


@dataclass
class InProcessModel:
    """A pinned model version, downloaded, with a client that generates in-process."""

    version: ModelVersionInfo
    model_dir: Path
    client: LocalModelClient

    @property
    def uri(self) -> str:
        return self.version.uri


def open_model_version(version: str | ModelVersionInfo, *, seed: int = 0) -> InProcessModel:
    """Download ``version`` (a resolved version, or a ``models:/`` URI pinned here;
    cached under VFOPS_HOME) and load it for generation."""
    from vfops.local import LocalModelClient

    if isinstance(version, str):
        version = pin_model_uri(version)
    model_dir = load_model_dir(version)
    client = LocalModelClient(
        model_dir, seed=seed, max_new_tokens_default=generation_cap(model_dir)
    )
    return InProcessModel(version, model_dir, client)


async def open_model_version_async(
    version: str | ModelVersionInfo, *, seed: int = 0
) -> InProcessModel:
    """:func:`open_model_version` off the event loop (downloads and loads weights)."""
    return await asyncio.to_thread(open_model_version, version, seed=seed)
