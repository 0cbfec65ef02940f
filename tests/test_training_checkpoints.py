"""Training checkpoints are atomic and verified: ``kill -9`` at any point of a save leaves
the old whole checkpoint or the new one, and a resume refuses a torn or damaged one in
one line (exit 2) before any model loads.

The crash points are real ``SIGKILL``s: the writer kills itself where
``VFOPS_TEST_CHECKPOINT_KILL_AT`` names (vfops.training._manifest.kill_point), which is
what ``kill -9`` from outside does at that instant. The long matrix (every point, the
whole ``vfops train`` CLI) is ``bench/checkpoint_kills.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.checkpoint_harness import SMALL_CONFIG, train, weights
from tests.inprocess_cli import run_vfops
from vfops.training import _manifest
from vfops.training._manifest import KILL_POINT_ENV, CheckpointError, open_checkpoint

# A save in a process of its own: the two files a checkpoint needs, the version in both.
_WRITER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from vfops.training import _manifest

    target, version = Path(sys.argv[1]), int(sys.argv[2])
    staging = _manifest.begin(target)
    (staging / "trainer_state.json").write_text(json.dumps({"step": version}))
    (staging / "sub").mkdir()
    (staging / "sub" / "weights.bin").write_bytes(bytes([version]) * 65536)
    _manifest.kill_point("staging")
    _manifest.seal(staging)
    _manifest.publish(staging, target)
    """
)


def _save(target: Path, version: int, kill_at: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if k != KILL_POINT_ENV}
    if kill_at:
        env[KILL_POINT_ENV] = kill_at
    proc = subprocess.run(
        [sys.executable, "-c", _WRITER, str(target), str(version)], env=env, check=False
    )
    return proc.returncode


def _version(target: Path) -> int:
    """The version a whole checkpoint holds (its two files agree)."""
    open_checkpoint(target)
    step = json.loads((target / "trainer_state.json").read_text())["step"]
    assert (target / "sub" / "weights.bin").read_bytes() == bytes([step]) * 65536
    return int(step)


@pytest.mark.parametrize(
    ("point", "survivor"), [("staging", 1), ("sealed", 1), ("aside", 2), ("published", 2)]
)
def test_a_save_killed_at_any_point_leaves_the_old_or_the_new_whole(
    tmp_path: Path, point: str, survivor: int
) -> None:
    target = tmp_path / "final"
    assert _save(target, 1) == 0
    assert _save(target, 2, kill_at=point) == -signal.SIGKILL
    # the kill happened where it was asked: the publish is visibly unfinished
    leftovers = {p.name for p in tmp_path.iterdir()}
    assert leftovers != {"final"}, leftovers
    assert _version(target) == survivor
    assert {p.name for p in tmp_path.iterdir()} - {".final.partial"} == {"final"}
    assert _save(target, 3) == 0  # and the next save goes through
    assert _version(target) == 3
    assert {p.name for p in tmp_path.iterdir()} == {"final"}


def test_a_first_save_killed_leaves_nothing_to_resume(tmp_path: Path) -> None:
    target = tmp_path / "final"
    assert _save(target, 1, kill_at="sealed") == -signal.SIGKILL
    assert _version(target) == 1  # sealed: finished by the next reader
    target2 = tmp_path / "step-2"
    assert _save(target2, 2, kill_at="staging") == -signal.SIGKILL
    with pytest.raises(CheckpointError, match=r"is not a folder; pass a checkpoint folder"):
        open_checkpoint(target2)


def _sealed(folder: Path, step: int) -> Path:
    staging = _manifest.begin(folder)
    (staging / "trainer_state.json").write_text(json.dumps({"step": step}))
    (staging / "accelerate").mkdir()
    (staging / "accelerate" / "model.safetensors").write_bytes(b"w" * 1000)
    _manifest.seal(staging)
    _manifest.publish(staging, folder)
    return folder


def _refusal(
    resume: Path, config: Path, monkeypatch: pytest.MonkeyPatch, *extra: str
) -> tuple[int, str]:
    """``vfops train CONFIG --resume RESUME`` in-process (the console script's entry
    point, as a user runs it): its exit code and stderr; training must not start."""

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started: the checkpoint was not refused at the door")

    import vfops.training._run as training_run

    monkeypatch.setattr(training_run, "run_recipe", no_training)
    monkeypatch.setattr(training_run, "_launch", no_training)
    return run_vfops(["train", str(config), "--resume", str(resume), *extra], monkeypatch)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(
        f'[model]\npath = "{tmp_path / "m"}"\nbuild_tiny_if_missing = true\n'
        '[environment]\nid = "lucky_digit"\n[run]\ntracking = false\n'
    )
    return path


def test_a_checkpoint_without_its_manifest_is_refused_in_one_line(
    tmp_path: Path, config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the in-place writer left when killed: step-4 weights, a step-2 state, and
    (now) no manifest: refused, naming the earlier checkpoint beside it."""
    earlier = _sealed(tmp_path / "out" / "step-2", 2)
    torn = _sealed(tmp_path / "out" / "final", 4)
    (torn / _manifest.MANIFEST_FILE).unlink()
    code, output = _refusal(torn, config, monkeypatch)
    assert code == 2, output
    assert output.strip().count("\n") == 0, output
    assert f"checkpoint {torn} is incomplete (no manifest.json" in output
    assert f"--resume {earlier}" in output
    # --check refuses it too
    code, output = _refusal(torn, config, monkeypatch, "--check")
    assert code == 2 and "is incomplete" in output, output


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove"])
def test_a_checkpoint_whose_files_differ_from_the_manifest_is_refused(
    tmp_path: Path, config: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    checkpoint = _sealed(tmp_path / "out" / "final", 2)
    weights = checkpoint / "accelerate" / "model.safetensors"
    if damage == "flip":
        weights.write_bytes(b"w" * 999 + b"x")
    elif damage == "truncate":
        weights.write_bytes(b"w" * 10)
    else:
        weights.unlink()
    code, output = _refusal(checkpoint, config, monkeypatch)
    assert code == 2, output
    assert output.strip().count("\n") == 0, output
    assert "accelerate/model.safetensors" in output and "is damaged" in output
    assert "train again without --resume" in output  # nothing else beside it


def test_a_whole_checkpoint_is_accepted_and_hashed_once(tmp_path: Path) -> None:
    checkpoint = _sealed(tmp_path / "final", 2)
    assert open_checkpoint(checkpoint) == checkpoint.resolve()
    # changed after it was verified: verified again, and refused
    (checkpoint / "trainer_state.json").write_text(json.dumps({"step": 3}))
    with pytest.raises(CheckpointError, match=r"trainer_state\.json differs"):
        open_checkpoint(checkpoint)


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, tuple[bytes, bytes]]:
    """A config, a 2-step run's output folder, and the weights of a clean resume to 4."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("ckpt")
    config = root / "c.toml"
    config.write_text(SMALL_CONFIG.format(model=root / "tiny", out=root / "base"))
    first = train(config)
    assert first.returncode == 0, first.stderr[-3000:]
    clean = train(
        config, "--steps", "4", "--resume", str(root / "base" / "final"),
        "--output-dir", str(root / "clean"),
    )  # fmt: skip
    assert clean.returncode == 0, clean.stderr[-3000:]
    return config, root / "base", weights(root / "clean" / "final")


@pytest.mark.train
@pytest.mark.second_pass
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("point", "left"), [("staging", ".final.partial"), ("aside", ".final.old")]
)
def test_a_resume_killed_mid_checkpoint_then_resumed_equals_a_clean_resume(
    trained: tuple[Path, Path, tuple[bytes, bytes]], tmp_path: Path, point: str, left: str
) -> None:
    """The README's resume, into the folder it resumes from, killed -9 while it writes
    ``final`` (before the old one moves; after it moved aside, the new one not yet in
    place); the same command again exits 0 with weights bit-identical to a clean resume."""
    config, base, clean = trained
    out = tmp_path / "out"
    shutil.copytree(base, out)
    command = ["--steps", "4", "--resume", str(out / "final"), "--output-dir", str(out)]
    killed = train(config, *command, kill_at=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert (out / left).is_dir()  # killed mid-publish, where it was asked
    again = train(config, *command)
    assert again.returncode == 0, again.stderr[-3000:]
    assert weights(out / "final") == clean
    assert {p.name for p in out.iterdir()} == {"final", "heldout"}  # and its eval rows
