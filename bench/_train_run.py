"""One ``vfops.training.train`` run in a process of its own, its result as JSON (shared by
``loss_variants.py`` and ``real_model_vllm.py``).

    python bench/_train_run.py CONFIG RESULT_JSON
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def train_in_child(
    config: Path, result: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run ``config`` (tracking off) in a new process; its ``TrainResult`` lands in ``result``."""
    return subprocess.run(
        [sys.executable, __file__, str(config), str(result)],
        env=env, capture_output=True, text=True,
    )  # fmt: skip


def main(config: Path, result: Path) -> int:
    import vfops.training as training

    outcome = training.train(training.resolve_config(config, tracking=False))
    result.write_text(json.dumps(outcome.to_json(), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
