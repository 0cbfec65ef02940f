"""The typed training config: every shipped config validates; bad files fail in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from vfops.training import ConfigError, GRPOConfig, config_help, load_config

REPO = Path(__file__).resolve().parent.parent
SHIPPED = sorted((REPO / "configs" / "train").glob("*.toml"))


def test_configs_are_shipped() -> None:
    names = {p.name for p in SHIPPED}
    assert {"cpu_lucky_digit.toml", "gpu_vllm_example.toml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_validates(path: Path) -> None:
    config = load_config(path)
    assert Path(config.model.path).is_absolute()
    if config.run.deepspeed:
        assert Path(config.run.deepspeed).is_file()


def test_every_field_has_help_text() -> None:
    helps = config_help()
    assert len(helps) > 40
    missing = [name for name, text in helps.items() if len(text) < 5]
    assert not missing
    assert "generation.backend" in helps and "generation.sync" in helps


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text('[model]\npath = "m"\n[environment]\nid = "lucky_digit"\n' + body)
    return path


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("[loss]\ntype = 'ppo'\n", "[loss] type = 'ppo' is invalid; use one of: grpo, dr_grpo"),
        ("[loss]\ntpye = 'grpo'\n", "unknown field 'tpye'"),
        ("[generaton]\n", "unknown section [generaton]"),
        ("[generation]\ngroup_size = 1\n", "group_size = 1; GRPO needs 2 or more"),
        ("[generation]\ngroup_size = '8'\n", "group_size = '8'; use an integer"),
        ("[generation]\ntemperature = 0\n", "temperature > 0"),
        ("[generation]\nbackend = 'sglang'\n", "use one of: hf, vllm"),
        ("[optim]\nlr = -1.0\n", "[optim] lr = -1.0"),
        ("[run]\nsteps = -1\n", "[run] steps = -1; it cannot be negative"),
        ("[loss\n", "invalid TOML"),
    ],
)
def test_bad_config_is_one_line_naming_the_field(tmp_path: Path, body: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, body))
    message = str(info.value)
    assert needle in message
    assert "\n" not in message


def test_config_is_constructible_in_python_and_paths_resolve(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "[run]\noutput_dir = 'out'\n"))
    assert config.model.path == str(tmp_path / "m")
    assert config.run.output_dir == str(tmp_path / "out")
    built = GRPOConfig()
    built.model.path, built.environment.id = "x", "y"
    assert built.validate() is built
    assert dataclasses.asdict(built)["generation"]["backend"] == "hf"
    with pytest.raises(ConfigError, match=r"\[model\] path is empty"):
        GRPOConfig().validate()
