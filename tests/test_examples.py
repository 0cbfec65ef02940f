"""The examples that ship inside vfops (vfops/_examples.py), as a checkout sees them.

One copy in git: a checkout's ``environments/NAME`` and ``configs/train/NAME.toml`` are
links to ``vfops/templates/examples/`` (what the wheel ships; tests/test_wheel_install.py
runs them from the installed wheel). ``--example NAME`` reads a config as if it were
``./configs/train/NAME.toml``, so in the checkout's root it is exactly that file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import vfops
from tests.inprocess_cli import run_vfops
from vfops._examples import EXAMPLES, example_environments, example_train_configs
from vfops.training import example_config, load_config

CHECKOUT = Path(vfops.__file__).resolve().parents[1]


def test_the_checkouts_examples_are_links_to_what_ships() -> None:
    environments = example_environments()
    assert set(environments) >= {"arithmetic", "lucky_digit", "calculator", "guess_number"}
    for name, project in environments.items():
        link = CHECKOUT / "environments" / name
        assert link.is_symlink() and link.resolve() == project, name
    assert set(example_train_configs()) == {
        "cpu_lucky_digit",
        "cpu_lora_example",
        "cpu_smollm2_reverse_text",
        "cpu_smollm2_reverse_text_full",
    }
    for name, file in example_train_configs().items():
        link = CHECKOUT / "configs" / "train" / f"{name}.toml"
        assert link.is_symlink() and link.resolve() == file, name
    assert EXAMPLES.is_relative_to(CHECKOUT / "vfops")


def test_an_example_config_is_the_checkouts_file_read_from_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(CHECKOUT)
    assert example_config("cpu_lucky_digit") == load_config("configs/train/cpu_lucky_digit.toml")
    monkeypatch.chdir(tmp_path)  # elsewhere: its model and outputs land in ./.vfops-train
    config = example_config("cpu_lucky_digit")
    assert Path(config.model.path) == tmp_path / ".vfops-train" / "tiny-model"
    assert Path(config.run.output_dir) == tmp_path / ".vfops-train" / "cpu_lucky_digit"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["train", "--example", "gpu", "--check"],
            "error: no example training config named 'gpu'; pass --example with one of: "
            "cpu_lora_example, cpu_lucky_digit, cpu_smollm2_reverse_text, "
            "cpu_smollm2_reverse_text_full",
        ),
        (
            ["train", "--check"],
            "error: give one training config: CONFIG.toml or --example NAME (not both); "
            "vfops train --example cpu_lucky_digit is the CPU example",
        ),
        (
            ["env", "install", "--example", "arith"],
            "error: no example environment named 'arith'; pass --example with one of: "
            "arithmetic, calculator, code_exec, guess_number, judged_qa, lucky_digit, mixed, "
            "reverse_text",
        ),
        (
            ["env", "install", "arithmetic", "--example", "arithmetic"],
            "error: give one environment: SOURCE (a folder or NAME[@VERSION]) or --example "
            "NAME (not both)",
        ),
        (
            ["env", "publish", "--example", "arithmetic", "--bump", "patch"],
            "error: --bump changes the package's version in its folder; an example publishes "
            "as it ships: to change it, copy its folder and publish the copy",
        ),
    ],
)
def test_a_bad_example_is_one_line(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VFOPS_HOME", str(tmp_path / "home"))
    code, stderr = run_vfops(args, monkeypatch)
    assert (code, stderr.strip()) == (2, message)
    assert list(tmp_path.iterdir()) == []  # nothing written, no registry opened


def test_an_example_installed_from_its_own_files_is_left_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkout's editable install of the example is not replaced by a copy."""
    monkeypatch.chdir(tmp_path)
    code, stderr = run_vfops(["env", "install", "--example", "arithmetic"], monkeypatch)
    assert (code, stderr) == (0, "")
    project = example_environments()["arithmetic"]
    assert capsys.readouterr().out == f"arithmetic is installed from {project} already (editable)\n"
