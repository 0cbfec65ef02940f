"""The typed training config: every shipped config validates; a bad file names every
bad field at once, one line each; overrides are validated the same way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from vfops.training import ConfigError, GRPOConfig, config_from_dict, config_help, load_config
from vfops.training._config import GenerationConfig, RunConfig, VLLMServerSettings
from vfops.training._vllm import VLLMGenerationConfig

REPO = Path(__file__).resolve().parent.parent
SHIPPED = sorted((REPO / "configs" / "train").glob("*.toml"))
HEADER = '[model]\npath = "m"\n[environment]\nid = "lucky_digit"\n'


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
    assert helps["run.steps"] == RunConfig.model_fields["steps"].description


def _write(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(header + body)
    return path


@pytest.mark.parametrize(
    ("body", "line"),
    [
        (
            "[loss]\ntype = 'ppo'\n",
            "[loss].type: unknown loss type 'ppo'; installed: cispo, dapo, dr_grpo, grpo, gspo",
        ),
        ("[loss]\ntpye = 'grpo'\n", "[loss].tpye: unknown key; did you mean 'type'?"),
        ("[generaton]\n", "[generaton]: unknown table; did you mean 'generation'?"),
        ("[generation]\ngroup_size = 1\n", "[generation].group_size: must be >= 2, got 1"),
        ("[generation]\ngroup_size = '8'\n", "[generation].group_size: must be an integer"),
        ("[generation]\ntemperature = 0\n", "[generation].temperature: must be > 0, got 0"),
        ("[generation]\nbackend = 'sglang'\n", "[generation].backend: must be 'hf' or 'vllm', got"),
        ("[generation]\nbase_url = 'localhost:8000'\n", "[generation].base_url: must start with"),
        ("[generation]\napi_key_var = 'sk 1'\n", "[generation].api_key_var: must be the NAME"),
        ("[optim]\nlr = -1.0\n", "[optim].lr: must be > 0, got -1.0"),
        ("[run]\nsteps = -1\n", "[run].steps: must be >= 0, got -1"),
        ("[run]\ntracking = 1\n", "[run].tracking: must be true or false, got 1"),
        ("[loss]\nclip_low = 1.0\n", "[loss].clip_low: must be < 1, got 1.0"),
        ("[loss]\nimportance_correction = 'is'\n", "[loss].importance_correction: must be 'none'"),
        ("[loss]\nimportance_cap = 0.5\n", "[loss].importance_cap: must be >= 1, got 0.5"),
        ("[generation]\nmax_staleness = -1\n", "[generation].max_staleness: must be >= 0"),
        (
            "[generation]\nasync_steps = 2\nmax_staleness = 1\n",
            "[generation] max_staleness = 1 is below async_steps = 2, the lag of every batch",
        ),
        ("[lora]\ntarget_modules = 'q_proj'\n", "[lora].target_modules: must be a list"),
        ("[run]\nsteps = 5\n[run]\n", "invalid TOML at line 7, column 5: Cannot declare"),
        ("[loss\n", "invalid TOML at line 5, column 6: "),
    ],
)  # fmt: skip
def test_one_bad_field_is_one_line_naming_it(tmp_path: Path, body: str, line: str) -> None:
    path = _write(tmp_path, body)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {line}"), message
    assert "\n" not in message


def test_every_bad_field_is_reported_at_once(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "[generation]\ngroup_size = 1\nmax_tokens = '32'\n[run]\nsteps = -3\nstesp = 4\n",
        header='[model]\npath = ""\n',
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).splitlines() == [
        f"{path}: [model].path: must not be empty",
        f"{path}: [environment]: missing; add the [environment] table",
        f"{path}: [generation].group_size: must be >= 2, got 1",
        f"{path}: [generation].max_tokens: must be an integer, got '32'",
        f"{path}: [run].steps: must be >= 0, got -3",
        f"{path}: [run].stesp: unknown key; did you mean 'steps'?",
    ]


def test_a_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_bytes(HEADER.encode() + b'[run]\nexperiment = "caf\xe9"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    offset = len(HEADER) + len('[run]\nexperiment = "caf')
    assert str(info.value) == (
        f"{path}: not UTF-8 text (byte 0xe9 at offset {offset}); save it as UTF-8"
    )
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "missing.toml")


def test_paths_resolve_against_the_files_folder(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "[generation]\nsync_dir = 'sync'\n"))
    assert config.model.path == str(tmp_path / "m")
    assert config.run.output_dir == str(tmp_path / "outputs" / "train")  # the default, too
    assert config.generation.sync_dir == str(tmp_path / "sync")
    assert config.run.deepspeed == ""  # empty stays empty
    # built in Python: nothing to resolve against
    built = config_from_dict({"model": {"path": "m"}, "environment": {"id": "e"}})
    assert built.model.path == "m" and built.run.output_dir == "outputs/train"


def test_a_linked_config_resolves_against_the_links_folder(tmp_path: Path) -> None:
    # configs/train/cpu_lucky_digit.toml links to the copy vfops ships: its relative
    # paths land in the checkout, not inside the package
    (tmp_path / "package").mkdir()
    real = _write(tmp_path / "package", "")
    (tmp_path / "checkout").mkdir()
    link = tmp_path / "checkout" / "c.toml"
    link.symlink_to(real)
    assert load_config(link).model.path == str(tmp_path / "checkout" / "m")


def test_overrides_are_validated_like_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "[run]\nsteps = 10\n")
    config = load_config(path)
    changed = config.with_overrides({"run.steps": 5, "run.output_dir": "/x", "loss.beta": 0.1})
    assert (changed.run.steps, changed.run.output_dir, changed.loss.beta) == (5, "/x", 0.1)
    assert changed.model.path == config.model.path == str(tmp_path / "m")
    assert config.run.steps == 10  # a copy: the loaded config is unchanged
    with pytest.raises(ConfigError) as info:
        config.with_overrides({"run.steps": -3, "run.stpes": 1, "generation.group_size": "8"})
    assert str(info.value).splitlines() == [
        "overrides: [generation].group_size: must be an integer, got '8'",
        "overrides: [run].steps: must be >= 0, got -3",
        "overrides: [run].stpes: unknown key; did you mean 'steps'?",
    ]
    with pytest.raises(ConfigError, match=r"cannot set 'run\.steps\.x': run\.steps is not a table"):
        config.with_overrides({"run.steps.x": 1})


def test_config_is_constructible_in_python_and_checked() -> None:
    built = GRPOConfig(model={"path": "x"}, environment={"id": "y"})  # type: ignore[arg-type]
    assert built.validate() == built
    assert built.model_dump()["generation"]["backend"] == "hf"
    with pytest.raises(ValidationError):
        GRPOConfig()  # type: ignore[call-arg]
    with pytest.raises(ValidationError):  # assignment is checked too
        built.run.steps = -1
    with pytest.raises(ConfigError, match=r"^config: \[model\]: missing; add the \[model\] table$"):
        config_from_dict({"environment": {"id": "y"}})


def test_vllm_generation_config_reuses_the_generation_fields() -> None:
    shared = set(VLLMServerSettings.model_fields)
    assert shared == {"base_url", "sync", "sync_dir", "api_key_var"}
    assert issubclass(VLLMGenerationConfig, VLLMServerSettings)
    assert issubclass(GenerationConfig, VLLMServerSettings)
    for name in shared:  # one declaration: same defaults, same help, same checks
        ours, theirs = VLLMGenerationConfig.model_fields[name], GenerationConfig.model_fields[name]
        assert (ours.default, ours.description, ours.metadata) == (
            theirs.default,
            theirs.description,
            theirs.metadata,
        )
    assert VLLMGenerationConfig().base_url == GenerationConfig().base_url
    with pytest.raises(ValidationError, match="must start with http"):
        VLLMGenerationConfig(base_url="localhost:8000")


def test_check_through_the_cli_is_one_line_per_problem(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "vfops", "train"]
    bad = _write(tmp_path, "[run]\nsteps = -3\n")
    proc = subprocess.run([*cmd, str(bad), "--check"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"error: {bad}: [run].steps: must be >= 0, got -3"]
    assert proc.stdout == ""

    bad.write_bytes(b"\xff\xfe[run]\n")
    proc = subprocess.run([*cmd, str(bad), "--check"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"error: {bad}: not UTF-8 text (byte 0xff at offset 0); save it as UTF-8"
    ]

    bad.write_text(HEADER + "[run]\nsteps = -3\nsave_every = -1\n")
    proc = subprocess.run([*cmd, str(bad), "--check"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: {bad}: [run].steps: must be >= 0, got -3",
        f"{bad}: [run].save_every: must be >= 0, got -1",
    ]

    # --check also checks what the run needs: the model folder (or leave to build it)
    good = _write(
        tmp_path, "", header=HEADER.replace('"m"\n', '"m"\nbuild_tiny_if_missing = true\n')
    )
    proc = subprocess.run(
        [*cmd, str(good), "--check", "--steps", "7", "--output-dir", "out"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{good}: ok (lucky_digit, 7 steps)"
