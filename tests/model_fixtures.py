"""A tiny base model and its checkpoints, for the model-registry and promotion tests.

The checkpoints differ only in ``max_new_tokens``, so a gate that rewards brevity tells
them apart without any training.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

__all__ = ["checkpoint", "tiny_base"]


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vfops.local import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", seed=3)


def checkpoint(base: Path, dst: Path, max_new_tokens: int) -> Path:
    """A copy of ``base`` at ``dst`` that generates at most ``max_new_tokens``."""
    shutil.copytree(base, dst)
    config_path = dst / "generation_config.json"
    config = json.loads(config_path.read_text())
    config["max_new_tokens"] = max_new_tokens
    config_path.write_text(json.dumps(config, indent=2))
    return dst
