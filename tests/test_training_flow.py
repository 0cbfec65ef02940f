"""The ``train-grpo`` flow: trains under the ``gpu`` concurrency limit and registers the result."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from vfops.flows.train import train_grpo
from vfops.orchestration import deployment_specs

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

    async def report() -> str:
        async with get_client() as client:
            (artifact,) = [a for a in await client.read_latest_artifacts() if a.key == "train-grpo"]
            return str(artifact.data)

    # the reward curve (train reward at steps 1 and 2, held-out at 0 and 2) is a chart
    # inside the report, as the sweep's is
    markdown = asyncio.run(report())
    assert "| baseline held-out reward | final held-out reward | steps |" in markdown
    prefix = "![reward per step](data:image/png;base64,"
    assert prefix in markdown
    encoded = markdown.split(prefix, 1)[1].split(")", 1)[0]
    assert base64.b64decode(encoded).startswith(b"\x89PNG")


def test_flow_and_cli_are_layers_over_the_one_entry_point(
    harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`vfops train` and the flow both call vfops.training.train (the flow through
    train_async) with the same resolved config, and report what it returns."""
    import json

    from typer.testing import CliRunner

    import vfops.training
    from vfops.cli._app import app
    from vfops.training import TrainResult, _run

    calls: list[tuple[Any, dict[str, Any]]] = []

    def entry_point(config: Any, **kwargs: Any) -> TrainResult:
        calls.append((config, kwargs))
        kwargs["progress"]("step", 1, {**dict.fromkeys(STEP_METRICS, 0.5)})
        return TrainResult(
            steps=config.run.steps,
            baseline_eval_reward=0.25,
            final_eval_reward=0.75,
            checkpoint=tmp_path / "final",
            processes=kwargs["num_processes"],
            mlflow_run_id="run-1",
            registered=f"models:/{config.run.register_as}/4",
        )

    # the one entry point, wherever it is reached from: the package (the CLI) and its
    # module (train_async, which the flow awaits)
    monkeypatch.setattr(vfops.training, "train", entry_point)
    monkeypatch.setattr(_run, "train", entry_point)
    cli = CliRunner().invoke(
        app, ["train", str(CPU_CONFIG), "--steps", "3", "--num-processes", "2",
              "--register-as", "same", "--json"],
    )  # fmt: skip
    assert cli.exit_code == 0, cli.output
    assert "step 1/3  reward 0.500" in cli.output  # the CLI's progress line
    summary = asyncio.run(train_grpo(str(CPU_CONFIG), steps=3, num_processes=2, register_as="same"))
    assert json.loads(cli.stdout.strip().splitlines()[-1]) == summary
    assert summary["registered_version"] == "4" and summary["mlflow_run_id"] == "run-1"
    (cli_config, cli_kwargs), (flow_config, flow_kwargs) = calls
    assert cli_config == flow_config and cli_config.run.steps == 3
    assert cli_config.run.register_as == "same"
    given = [{k: v for k, v in kw.items() if v is not None and k != "progress"} for kw in
             (cli_kwargs, flow_kwargs)]  # fmt: skip
    assert given == [{"num_processes": 2}, {"num_processes": 2}]


STEP_METRICS = ("reward_mean", "reward_std", "loss", "kl", "clip_fraction", "generation_s",
                "training_s", "weight_sync_s", "tokens_per_s", "mismatch_kl",
                "truncated_fraction", "entropy", "grad_norm")  # fmt: skip


def test_train_evaluate_promote_flow_trains_registers_and_gates(
    harness: None, tmp_path: Path
) -> None:
    """The loop as one flow run: the checkpoint is registered and put through the
    gate (the first version of a model has no holder: promoted on its evaluation)."""
    from prefect.client.orchestration import get_client

    from vfops.flows.train_evaluate_promote import train_evaluate_promote_flow
    from vfops.models import promotion_history
    from vfops.tracking import mlflow_client

    model = build_tiny_model_for(tmp_path)
    result = asyncio.run(
        train_evaluate_promote_flow(
            str(_config_at(tmp_path, model)),
            register_as="loop-tiny",
            gate_envs=["lucky_digit"],
            steps=2,
            output_dir=str(tmp_path / "out"),
            gate_examples=4,
        )
    )
    assert result["model_uri"] == "models:/loop-tiny/1"
    assert result["training"]["steps"] == 2
    assert result["decision"]["outcome"] == "promoted"
    assert mlflow_client().get_model_version_by_alias("loop-tiny", "champion").version == 1
    (event,) = promotion_history("loop-tiny")
    assert (event.to_version, event.outcome) == ("1", "promoted")
    (gate,) = result["decision"]["envs"]
    assert gate["env"] == "lucky_digit" and gate["candidate_run_id"]

    async def report() -> str:
        async with get_client() as client:
            artifact = await client.read_latest_artifacts()
            found = [a for a in artifact if a.key == "train-evaluate-promote-loop-tiny"]
            return str(found[0].data) if found else ""

    assert "`models:/loop-tiny/1`: promoted" in asyncio.run(report())


def build_tiny_model_for(tmp_path: Path) -> Path:
    from vfops.local import build_tiny_model

    return build_tiny_model(tmp_path / "tiny", seed=0)


def _config_at(tmp_path: Path, model: Path) -> Path:
    config = tmp_path / "c.toml"
    config.write_text(
        CPU_CONFIG.read_text().replace(
            'path = "../../.vfops-train/tiny-model"', f'path = "{model}"'
        )
    )
    return config
