"""A tiny base model and its checkpoints, for the model-registry and promotion tests.

The checkpoints differ only in ``max_new_tokens``, so a gate that rewards brevity (the
installed ``brevity_gate`` environment, :func:`gate_env`) tells them apart without any
training.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["GATE_ENV", "checkpoint", "gate_env", "tiny_base"]

GATE_ENV = "brevity_gate"


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


@pytest.fixture(scope="module")
def gate_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A tiny installed environment package (a module and its dist-info on sys.path)."""
    site = tmp_path_factory.mktemp("gate_site")
    (site / "brevity_gate_env.py").write_text(
        textwrap.dedent(
            """
            from datasets import Dataset

            import vfops


            def load_environment(fail_on: str = "") -> vfops.Environment:
                def brevity(prompt, completion) -> float:
                    if fail_on and fail_on in str(prompt):  # a scoring bug, on purpose
                        raise ValueError(f"cannot score {fail_on!r}")
                    text = completion[-1]["content"] if completion else ""
                    return 1.0 / (1.0 + len(text or ""))

                rows = [{"question": f"Tell me about item {i}.", "answer": ""} for i in range(12)]
                return vfops.SingleTurnEnv(
                    eval_dataset=Dataset.from_list(rows), rubric=vfops.Rubric(funcs=[brevity])
                )
            """
        )
    )
    dist = site / "brevity_gate_env-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: brevity-gate-env\nVersion: 0.0.1\n"
    )
    (dist / "entry_points.txt").write_text(
        f"[vfops.environments]\n{GATE_ENV} = brevity_gate_env:load_environment\n"
    )
    sys.path.insert(0, str(site))
    yield GATE_ENV
    sys.path.remove(str(site))
    sys.modules.pop("brevity_gate_env", None)
