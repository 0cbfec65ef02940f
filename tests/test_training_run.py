"""``vfops.training.train``: the one entry point; a launched run reports through files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from vfops._errors import VfopsError
from vfops.training import ConfigError, TrainingProcessError, load_config, resolve_config, train

REPO = Path(__file__).resolve().parent.parent
CPU_CONFIG = REPO / "configs" / "train" / "cpu_lucky_digit.toml"

# Every Python process of the launch prints this: result-shaped JSON on stdout, once
# at start and once at exit (after the result file is written).
NOISY_SITECUSTOMIZE = """
import atexit, json, sys
FAKE = {"steps": 999, "baseline_eval_reward": 9.0, "final_eval_reward": 9.0,
        "processes": 9, "checkpoint": "/nowhere", "registered": None}
print("noise: " + json.dumps(FAKE), flush=True)
atexit.register(lambda: print(json.dumps(FAKE), flush=True))
"""


def test_resolve_config_applies_overrides_to_a_copy(tmp_path: Path) -> None:
    config = load_config(CPU_CONFIG)
    steps = config.run.steps
    resolved = resolve_config(
        config, steps=3, output_dir=tmp_path / "o", register_as="m", tracking=False
    )
    assert (resolved.run.steps, resolved.run.register_as, resolved.run.tracking) == (3, "m", False)
    assert resolved.run.output_dir == str((tmp_path / "o").resolve())
    assert config.run.steps == steps != 3 and config.run.register_as == ""  # caller's untouched
    with pytest.raises(ConfigError, match=r"\[run\]\.steps: must be >= 0, got -1"):
        resolve_config(CPU_CONFIG, steps=-1)
    with pytest.raises(VfopsError, match=r"zero2\.json"):
        resolve_config(CPU_CONFIG, deepspeed=tmp_path / "missing.json")
    with pytest.raises(VfopsError, match="not a folder"):
        train(CPU_CONFIG, resume=tmp_path / "missing")


def _noisy_children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "noisy_site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NOISY_SITECUSTOMIZE)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    )


def _tiny_config(tmp_path: Path) -> Any:
    from vfops.local import build_tiny_model

    config = load_config(CPU_CONFIG)
    config.model.path = str(build_tiny_model(tmp_path / "tiny", seed=0))
    return config


@pytest.mark.train
def test_a_launched_run_reports_through_files_not_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Two processes under accelerate launch: the result and every progress event come
    back although each process prints result-shaped JSON before and after it."""
    pytest.importorskip("torch")
    config = _tiny_config(tmp_path)
    _noisy_children(tmp_path, monkeypatch)
    events: list[tuple[str, int]] = []
    result = train(
        config,
        steps=2,
        output_dir=tmp_path / "out",
        num_processes=2,
        tracking=False,
        progress=lambda kind, step, metrics: events.append((kind, step)),
    )
    assert (result.steps, result.processes, result.registered) == (2, 2, None)
    assert result.checkpoint == (tmp_path / "out" / "final").resolve()
    assert (result.checkpoint / "trainer_state.json").is_file()
    assert len(result.history) == 2 and "reward_mean" in result.history[0]
    assert events == [("eval", 0), ("step", 1), ("step", 2), ("eval", 2)]
    captured = capfd.readouterr()
    assert captured.err.count("noise: ") >= 3  # the launcher and both ranks did print
    assert "noise" not in captured.out  # their stdout goes to this process's stderr


@pytest.mark.train
def test_a_launched_runs_user_error_is_one_line(tmp_path: Path) -> None:
    """A configuration error inside the launched processes comes back as the same one-line
    VfopsError (not a crash report)."""
    pytest.importorskip("torch")
    config = load_config(CPU_CONFIG)
    config.model.path = str(tmp_path / "no-model")
    config.model.build_tiny_if_missing = False
    with pytest.raises(VfopsError) as raised:
        train(config, steps=1, output_dir=tmp_path / "out", num_processes=2, tracking=False)
    assert not isinstance(raised.value, TrainingProcessError)
    assert "does not exist; build one with `vfops model build-tiny DIR`" in str(raised.value)
    assert "\n" not in str(raised.value)
