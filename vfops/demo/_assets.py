"""What the demo ships: the ``lucky_digit`` environment project and its CPU training config.

Both live in the vfops package (``vfops/templates/demo/``), so ``vfops demo`` works
after ``pip install vfops``; a checkout's ``environments/lucky_digit`` and
``configs/train/cpu_lucky_digit.toml`` are links to these same files.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vfops.training import GRPOConfig

DEMO_ASSETS = Path(__file__).resolve().parent.parent / "templates" / "demo"


def environment_project() -> Path:
    """The ``lucky_digit`` project folder (pyproject, module, README, tests)."""
    return DEMO_ASSETS / "lucky_digit"


def demo_train_config(workdir: Path) -> GRPOConfig:
    """The shipped CPU config, training the base model in ``workdir``."""
    from vfops.training import load_config

    return load_config(DEMO_ASSETS / "cpu_lucky_digit.toml").with_overrides(
        {
            "model.path": str(workdir / "base-model"),
            "model.build_tiny_if_missing": False,
            "run.output_dir": str(workdir / "train"),
        }
    )
