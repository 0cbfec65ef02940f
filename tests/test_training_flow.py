"""The ``train-grpo`` flow: trains under the ``gpu`` concurrency limit and registers the result."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("torch")

from flows.deployments import deployment_specs
from flows.train import train_grpo

# Prefect's clients (lease renewal, events) leave sockets to the test server for the
# garbage collector; that is Prefect's, not ours (as in test_flow_nightly.py).
pytestmark = [
    pytest.mark.train,
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

REPO = Path(__file__).resolve().parent.parent
CPU_CONFIG = REPO / "configs" / "train" / "cpu_lucky_digit.toml"


def test_train_grpo_is_deployed() -> None:
    assert "train-grpo" in {spec.name for spec in deployment_specs()}


def test_flow_trains_under_the_gpu_limit_and_registers(harness: None, tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client

    from vfops.local import build_tiny_model
    from vfops.tracking import mlflow_client

    model = build_tiny_model(tmp_path / "tiny", seed=0)
    config = tmp_path / "c.toml"
    config.write_text(
        CPU_CONFIG.read_text().replace(
            'path = "../../.vfops-train/tiny-model"', f'path = "{model}"'
        )
    )
    summary = asyncio.run(
        train_grpo(
            str(config),
            steps=2,
            output_dir=str(tmp_path / "out"),
            register_as="flow-tiny",
            gpus=2,
            gpu_limit="gpu-test",
        )
    )
    assert summary["steps"] == 2 and summary["registered"] == "models:/flow-tiny/1"
    assert {"baseline_eval_reward", "final_eval_reward", "checkpoint"} <= set(summary)
    version = mlflow_client().get_model_version("flow-tiny", "1")
    assert version.tags["vfops.base_model"] == "tiny-llama"

    async def limit() -> tuple[int, int]:
        async with get_client() as client:
            gcl = await client.read_global_concurrency_limit_by_name("gpu-test")
            return gcl.limit, gcl.active_slots

    assert asyncio.run(limit()) == (2, 0)  # created for 2 GPUs, slots released
