"""A short ``vfops train`` on the tiny CPU model, killed (``KILL_POINT_ENV``) at a point
of its checkpoint save and resumed: shared by tests/test_training_checkpoints.py (CI)
and bench/checkpoint_kills.py (every point, repeated)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from vfops.training._manifest import KILL_POINT_ENV

SMALL_CONFIG = """
[model]
path = "{model}"
build_tiny_if_missing = true
[environment]
id = "lucky_digit"
args = {{ digits = "01", max_tokens = 8, reward = "dense" }}
[generation]
prompts_per_step = 2
group_size = 4
max_tokens = 4
[loss]
mask_truncated = false
[optim]
lr = 1e-3
micro_batch_size = 4
[run]
steps = 2
output_dir = "{out}"
eval_examples = 2
precision = "fp32"
tracking = false
"""


def train(config: Path, *args: str, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != KILL_POINT_ENV}
    if kill_at:
        env[KILL_POINT_ENV] = kill_at
    return subprocess.run(
        [sys.executable, "-m", "vfops", "train", str(config), *args],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def weights(checkpoint: Path) -> tuple[bytes, bytes]:
    return (
        (checkpoint / "model" / "model.safetensors").read_bytes(),
        (checkpoint / "accelerate" / "model.safetensors").read_bytes(),
    )
