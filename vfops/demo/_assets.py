"""What the demo ships: the ``lucky_digit`` example environment and its CPU training config.

Both are examples inside the vfops package (vfops/_examples.py), so ``vfops demo`` works
after ``pip install vfops``; a checkout's ``environments/lucky_digit`` and
``configs/train/cpu_lucky_digit.toml`` are links to these same files.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vfops._examples import example_environment

if TYPE_CHECKING:
    from vfops.training import GRPOConfig


def environment_project() -> Path:
    """The ``lucky_digit`` project folder (pyproject, module, README, tests)."""
    return example_environment("lucky_digit")


def demo_train_config(workdir: Path) -> GRPOConfig:
    """The shipped CPU config, training the base model in ``workdir``."""
    from vfops.training import example_config

    # its paths resolve in the current folder, but the demo's go under workdir
    return example_config("cpu_lucky_digit").with_overrides(
        {
            "model.path": str(workdir / "base-model"),
            "model.build_tiny_if_missing": False,
            "run.output_dir": str(workdir / "train"),
        }
    )
