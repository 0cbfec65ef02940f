"""``vfops train``: one-line errors, the missing extra, and a short real run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vfops.cli._app import app

REPO = Path(__file__).resolve().parent.parent
CPU_CONFIG = REPO / "configs" / "train" / "cpu_lucky_digit.toml"


def test_bad_config_is_one_line_and_non_zero(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\npath = "m"\n[environment]\nid = "x"\n[loss]\ntype = "ppo"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "vfops", "train", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    said = "[loss].type: unknown loss type 'ppo'; installed: cispo, dapo, dr_grpo, grpo, gspo"
    assert said in proc.stderr


def test_check_validates_without_training() -> None:
    result = CliRunner().invoke(app, ["train", str(CPU_CONFIG), "--check"])
    assert result.exit_code == 0, result.output
    assert "lucky_digit" in result.output


def test_missing_train_extra_names_the_extra(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # as if the [train] extra were not installed\n"
        "from vfops.cli._app import run\n"
        f"sys.argv = ['vfops', 'train', {str(CPU_CONFIG)!r}]\n"
        "run()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "install the [train] extra: pip install 'vfops[train]'" in proc.stderr


def _cpu_config_on_a_tiny_model(tmp_path: Path) -> Path:
    """The shipped CPU config, pointed at a tiny model built in ``tmp_path``."""
    from vfops.local import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", seed=0)
    config = tmp_path / "c.toml"
    config.write_text(
        CPU_CONFIG.read_text().replace(
            'path = "../../.vfops-train/tiny-model"', f'path = "{model}"'
        )
    )
    return config


@pytest.mark.train
def test_short_cpu_run_prints_baseline_and_final(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    config = _cpu_config_on_a_tiny_model(tmp_path)
    result = CliRunner().invoke(
        app,
        ["train", str(config), "--steps", "2", "--no-tracking",
         "--output-dir", str(tmp_path / "out")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "baseline held-out reward" in result.output and "after 2 steps" in result.output
    assert "step 1/2  reward" in result.output and "step 2/2  held-out reward" in result.output
    assert "  mismatch " in result.output  # the sampler/trainer mismatch, every step
    assert (tmp_path / "out" / "final" / "trainer_state.json").is_file()


@pytest.mark.train
def test_a_run_prints_only_its_own_lines_and_what_moves(tmp_path: Path) -> None:
    """stderr is the run's own lines (no "Loading weights" bar, no library notice), and a
    step's line shows what moves: reward, truncation, entropy, gradient norm, and the
    loss in scientific notation (an on-policy GRPO loss is ~1e-9, which "+0.0000" hid);
    no KL column when the loss has no KL term (the config's beta is 0)."""
    import os
    import re

    config = _cpu_config_on_a_tiny_model(tmp_path)
    quiet = ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY",
             "DS_ACCELERATOR")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in quiet}
    proc = subprocess.run(
        [sys.executable, "-m", "vfops", "train", str(config), "--steps", "2", "--no-tracking",
         "--output-dir", str(tmp_path / "out")],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # stdout is the result for a person: no DeepSpeed "[WARNING] ... Setting accelerator
    # to CPU" (this machine has no GPU), no JSON blob (that is --json's)
    rewards, where = proc.stdout.splitlines()
    assert re.fullmatch(
        r"baseline held-out reward \d\.\d{3} -> final \d\.\d{3} after 2 steps "
        r"\([+-]\d\.\d{3}, 95% CI \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\], paired bootstrap "
        r"p[=<][\d.]+ over 64 prompts\)",
        rewards,
    )
    # the held-out rows of both evals, as the paired test read them
    heldout = sorted((tmp_path / "out" / "heldout").iterdir())
    assert [p.name for p in heldout] == ["step-000000.jsonl", "step-000002.jsonl"]
    rows = [json.loads(line) for line in heldout[1].read_text().splitlines()]
    assert len(rows) == 64 and {"example_id", "prompt", "completion", "reward"} <= rows[0].keys()
    assert where == f"checkpoint {tmp_path / 'out' / 'final'}", proc.stdout
    lines = proc.stderr.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["step", "0/2"],
        ["step", "1/2"],
        ["step", "2/2"],
        ["step", "2/2"],
    ], proc.stderr
    step = lines[1]
    for part in (r"reward -?\d\.\d{3}±\d\.\d{3}", r"truncated \d+%", r"entropy \d+\.\d{3}",
                 r"grad \d+\.\d{3}", r"loss [+-]\d\.\d\de[+-]\d\d"):  # fmt: skip
        assert re.search(part, step), (part, step)
    assert " kl " not in step, step


LOAD_AND_UNWRAP = """
import sys
from vfops.training import resolve_config
from vfops.training._setup import build_accelerator, load_model
cfg = resolve_config(sys.argv[1], tracking=False)
accelerator, _ = build_accelerator(cfg)
model, _, _ = load_model(cfg, accelerator, "sdpa")
accelerator.unwrap_model(model)  # as saving a checkpoint does: DeepSpeed loads here
"""


@pytest.mark.train
def test_the_python_api_loads_a_policy_without_a_word(tmp_path: Path) -> None:
    """Through the Python API (no CLI setting quiet variables): no "Loading weights" bar,
    and no DeepSpeed "[WARNING] ... Setting accelerator to CPU" on this GPU-less machine."""
    import os

    config = _cpu_config_on_a_tiny_model(tmp_path)
    quiet = ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY",
             "DS_ACCELERATOR")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in quiet}
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_AND_UNWRAP, str(config)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (proc.stdout, proc.stderr) == ("", "")


@pytest.mark.train
def test_two_processes_train_as_one_process_group(tmp_path: Path) -> None:
    """--num-processes 2 goes through accelerate launch: 2 ranks (gloo on a CPU), one run."""
    pytest.importorskip("torch")
    import json

    config = _cpu_config_on_a_tiny_model(tmp_path)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "vfops", "train", str(config), "--steps", "2",
         "--output-dir", str(out), "--num-processes", "2", "--register-as", "two-rank-tiny",
         "--json"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["processes"] == 2 and summary["steps"] == 2
    assert summary["registered"] == "models:/two-rank-tiny/1"  # once, by the main process
    assert (out / "final" / "trainer_state.json").is_file()
