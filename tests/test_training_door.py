"""Every training field's range is checked at the door: ``vfops train --check`` (and a run,
before torch loads) refuses each malformed config in one line naming the field and what
it allows, exit 2; the fixed config passes.

The first six rows are the fault probe's: configs that passed ``--check`` and then failed
with a traceback (or trained, with ``inf``). The rest go through the numeric fields one by
one, then paths, URLs, seeds and the environment's arguments.
"""

from __future__ import annotations

import math
import subprocess
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import annotated_types
import pytest

from tests.inprocess_cli import run_vfops
from vfops._config import ConfigModel
from vfops.training import ConfigError, GRPOConfig, load_config

pytestmark = pytest.mark.train  # the LoRA targets are read from a real tiny model's files

_BASE = """
[model]
path = "{model}"
[environment]
id = "lucky_digit"
args = {{ digits = "01", max_tokens = 8 }}
[generation]
prompts_per_step = 2
group_size = 4
max_tokens = 4
[loss]
clip_low = 0.2
[optim]
lr = 1e-3
[lora]
enabled = true
target_modules = ["q_proj", "v_proj"]
[run]
steps = 2
output_dir = "{out}"
tracking = false
"""

# (case id, "section.key = TOML value", what the one line must say)
CASES: list[tuple[str, str, str]] = [
    # the probe's six that passed --check, and inf that trained
    ("beta1-above-1", "optim.adam_beta1 = 1.5", "[optim].adam_beta1: must be < 1, got 1.5"),
    ("decay-negative", "optim.weight_decay = -5", "[optim].weight_decay: must be >= 0, got -5"),
    ("lora-dropout-2", "lora.dropout = 2.0", "[lora].dropout: must be < 1, got 2.0"),
    ("lora-unknown-target", 'lora.target_modules = ["q_proj", "qkv_proj"]',
     "[lora] target_modules: 'qkv_proj' name no linear, embedding or convolution module"),
    ("model-path-file", 'model.path = "{file}"',
     "[model].path: must be a Hugging Face model folder"),
    ("output-dir-file", 'run.output_dir = "{file}"', "[run].output_dir: must be a folder, but"),
    ("lr-inf", "optim.lr = inf", "[optim].lr: must be a finite number, got inf"),
    ("temperature-inf", "generation.temperature = inf",
     "[generation].temperature: must be a finite number, got inf"),
    # every other numeric field's range
    ("lr-nan", "optim.lr = nan", "[optim].lr: must be a finite number, got nan"),
    ("lr-zero", "optim.lr = 0.0", "[optim].lr: must be > 0, got 0.0"),
    ("beta1-negative", "optim.adam_beta1 = -0.1", "[optim].adam_beta1: must be >= 0, got -0.1"),
    ("beta2-one", "optim.adam_beta2 = 1.0", "[optim].adam_beta2: must be < 1, got 1.0"),
    ("decay-inf", "optim.weight_decay = inf", "[optim].weight_decay: must be a finite number"),
    ("grad-norm-negative", "optim.max_grad_norm = -1.0", "[optim].max_grad_norm: must be >= 0"),
    ("grad-norm-inf", "optim.max_grad_norm = inf", "[optim].max_grad_norm: must be a finite"),
    ("warmup-negative", "optim.warmup_steps = -1", "[optim].warmup_steps: must be >= 0, got -1"),
    ("micro-batch-zero", "optim.micro_batch_size = 0", "[optim].micro_batch_size: must be >= 1"),
    ("lora-dropout-negative", "lora.dropout = -0.5", "[lora].dropout: must be >= 0, got -0.5"),
    ("lora-dropout-one", "lora.dropout = 1.0", "[lora].dropout: must be < 1, got 1.0"),
    ("lora-rank-zero", "lora.r = 0", "[lora].r: must be >= 1, got 0"),
    ("lora-alpha-zero", "lora.alpha = 0", "[lora].alpha: must be >= 1, got 0"),
    ("lora-no-targets", "lora.target_modules = []", "[lora].target_modules: needs at least 1"),
    ("lora-empty-target", 'lora.target_modules = [""]',
     "[lora].target_modules[0]: must not be empty"),
    ("temperature-zero", "generation.temperature = 0.0",
     "[generation].temperature: must be > 0, got 0.0"),
    ("temperature-nan", "generation.temperature = nan",
     "[generation].temperature: must be a finite"),
    ("eval-temperature-negative", "run.eval_temperature = -1.0",
     "[run].eval_temperature: must be >= 0, got -1.0"),
    ("eval-temperature-inf", "run.eval_temperature = inf",
     "[run].eval_temperature: must be a finite"),
    ("clip-low-one", "loss.clip_low = 1.0", "[loss].clip_low: must be < 1, got 1.0"),
    ("clip-high-negative", "loss.clip_high = -0.1", "[loss].clip_high: must be >= 0, got -0.1"),
    ("clip-high-inf", "loss.clip_high = inf", "[loss].clip_high: must be a finite number"),
    ("kl-beta-negative", "loss.beta = -1.0", "[loss].beta: must be >= 0, got -1.0"),
    ("kl-beta-nan", "loss.beta = nan", "[loss].beta: must be a finite number, got nan"),
    ("importance-cap-below-1", "loss.importance_cap = 0.5", "[loss].importance_cap: must be >= 1"),
    ("importance-cap-inf", "loss.importance_cap = inf", "[loss].importance_cap: must be a finite"),
    ("prompts-zero", "generation.prompts_per_step = 0",
     "[generation].prompts_per_step: must be >= 1"),
    ("group-of-one", "generation.group_size = 1", "[generation].group_size: must be >= 2, got 1"),
    ("max-tokens-zero", "generation.max_tokens = 0", "[generation].max_tokens: must be >= 1"),
    ("async-negative", "generation.async_steps = -1", "[generation].async_steps: must be >= 0"),
    ("concurrency-zero", "generation.max_concurrent = 0",
     "[generation].max_concurrent: must be >= 1"),
    ("generate-batch-zero", "generation.max_batch_size = 0",
     "[generation].max_batch_size: must be >= 1"),
    ("staleness-negative", "generation.max_staleness = -1",
     "[generation].max_staleness: must be >= 0"),
    ("steps-negative", "run.steps = -1", "[run].steps: must be >= 0, got -1"),
    ("save-every-negative", "run.save_every = -1", "[run].save_every: must be >= 0, got -1"),
    ("eval-every-negative", "run.eval_every = -1", "[run].eval_every: must be >= 0, got -1"),
    ("eval-examples-negative", "run.eval_examples = -1", "[run].eval_examples: must be >= 0"),
    ("seed-negative", "run.seed = -1", "[run].seed: must be >= 0, got -1"),
    ("seed-too-large", "run.seed = 4294967296", "[run].seed: must be <= 4294967295"),
    ("tiny-seed-negative", "model.tiny_seed = -3", "[model].tiny_seed: must be >= 0, got -3"),
    # paths, URLs, names
    ("model-path-not-a-model", 'model.path = "{empty_dir}"', "has no config.json"),
    ("model-path-missing", 'model.path = "{missing}"', "[model] path '{missing}' does not exist"),
    ("output-dir-under-a-file", 'run.output_dir = "{file}/out"',
     "[run].output_dir: cannot be created: {file} is a file"),
    ("output-dir-empty", 'run.output_dir = ""', "[run].output_dir: must not be empty"),
    ("deepspeed-folder", 'run.deepspeed = "{empty_dir}"',
     "[run].deepspeed: {empty_dir} is a folder"),
    ("sync-dir-file", 'generation.sync_dir = "{file}"', "[generation].sync_dir: must be a folder"),
    ("deepspeed-missing", 'run.deepspeed = "{missing}.json"',
     "[run] deepspeed '{missing}.json' does not exist"),
    ("url-credentials", 'generation.base_url = "http://user:pw@127.0.0.1:8000/v1"',
     "[generation].base_url: must not hold credentials"),
    ("url-key-in-query", 'generation.base_url = "http://127.0.0.1:8000/v1?api-key=sk-1"',
     "[generation].base_url: must have no query"),
    ("url-bad-port", 'generation.base_url = "http://127.0.0.1:99999/v1"',
     "[generation].base_url: is not a valid URL"),
    ("experiment-empty", 'run.experiment = ""', "[run].experiment: must not be empty"),
    ("register-as-slash", 'run.register_as = "team/model"',
     "[run].register_as: is not a registered model name ('/')"),
    ("register-as-alias", 'run.register_as = "model@champion"',
     "[run].register_as: is not a registered model name ('@')"),
    # the environment's arguments, checked against its load_environment signature
    ("env-arg-unknown", 'environment.args = { digits = "01", colour = "red" }',
     "[environment] args do not fit load_environment of 'lucky_digit': got an unexpected "
     "keyword argument 'colour'; it accepts: "),
    ("env-unknown", 'environment.id = "no_such_env"', "unknown environment 'no_such_env'"),
]  # fmt: skip


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tiny model, a file, an empty folder and a path that does not exist."""
    from vfops.local import build_tiny_model

    root = tmp_path_factory.mktemp("door")
    (root / "a-file").write_text("not a folder\n")
    (root / "empty").mkdir()
    return {
        "model": str(build_tiny_model(root / "tiny", seed=0)),
        "out": str(root / "out"),
        "file": str(root / "a-file"),
        "empty_dir": str(root / "empty"),
        "missing": str(root / "missing"),
    }


def _config(places: dict[str, str], change: str | None, folder: Path) -> Path:
    """The base config with ``section.key = value`` set (the key replaced in its table)."""
    text = _BASE.format(**places)
    if change is not None:
        dotted, value = (part.strip() for part in _filled(change, places).split("=", 1))
        section, key = dotted.split(".")
        lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key} =")]
        at = lines.index(f"[{section}]") + 1
        lines.insert(at, f"{key} = {value}")
        text = "\n".join(lines) + "\n"
    path = folder / "c.toml"
    path.write_text(text)
    return path


def _filled(text: str, places: dict[str, str]) -> str:
    for name, value in places.items():
        text = text.replace("{" + name + "}", value)
    return text


def test_the_fixed_config_passes(
    places: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(places, None, tmp_path)
    code, err = run_vfops(["train", str(config), "--check"], monkeypatch)
    assert (code, err) == (0, "")
    # an output head tied to the embeddings is stored once (not in the safetensors
    # header): config.json says it is tied
    tied = _config(places, 'lora.target_modules = ["lm_head", "all-linear"]', tmp_path)
    assert load_config(tied).lora.target_modules == ["lm_head", "all-linear"]


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 26
    assert len({case for case, _, _ in CASES}) == len(CASES)


@pytest.mark.parametrize(("change", "line"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_malformed_config_is_refused_by_check_in_one_line(
    places: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: str,
    line: str,
) -> None:
    config = _config(places, change, tmp_path)
    code, err = run_vfops(["train", str(config), "--check"], monkeypatch)
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert _filled(line, places) in err, err
    assert not Path(places["out"]).exists()  # nothing written


@pytest.mark.parametrize(
    "change",
    [
        "optim.lr = inf",
        'lora.target_modules = ["qkv_proj"]',
        'environment.args = { digits = "01", colour = "red" }',
    ],
)
def test_a_run_refuses_before_torch_loads(
    places: dict[str, str], tmp_path: Path, change: str
) -> None:
    """Not only --check: the run itself refuses at the door, torch never imported."""
    config = _config(places, change, tmp_path)
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules))\n"
        "from vfops.cli._app import run\n"
        f"sys.argv = ['vfops', 'train', {str(config)!r}]\nrun()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stdout.strip() == "torch imported: False"
    assert not Path(places["out"]).exists()


# --------------------------------------------------------------------------- every field


def _numeric_fields(model: type[Any], prefix: str = "") -> Iterator[tuple[str, Any, type]]:
    """(dotted name, field info, int or float) of every numeric leaf field of ``model``."""
    for name, info in model.model_fields.items():
        annotation = info.annotation
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        base = (
            args[0]
            if typing.get_origin(annotation) in (typing.Union, types.UnionType)
            else annotation
        )
        if isinstance(base, type) and issubclass(base, ConfigModel):
            yield from _numeric_fields(base, f"{prefix}{name}.")
        elif base in (int, float):
            yield f"{prefix}{name}", info, base


def _outside(bound: Any, kind: type) -> tuple[Any, str]:
    """A value just outside ``bound`` (an annotated_types bound) and the words refusing it."""
    step = 1 if kind is int else 0.5
    if isinstance(bound, annotated_types.Ge):
        low: Any = bound.ge
        return low - step, f"must be >= {_shown(low)}"
    if isinstance(bound, annotated_types.Gt):
        return bound.gt, f"must be > {_shown(bound.gt)}"
    if isinstance(bound, annotated_types.Lt):
        return bound.lt, f"must be < {_shown(bound.lt)}"
    assert isinstance(bound, annotated_types.Le), bound
    high: Any = bound.le
    return high + step, f"must be <= {_shown(high)}"


def _shown(number: Any) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


_BOUND_TYPES = (annotated_types.Ge, annotated_types.Gt, annotated_types.Lt, annotated_types.Le)


def _every_numeric_field() -> list[tuple[str, Any, type]]:
    from vfops.training._vllm_server import VLLMGenerationConfig

    fields = list(_numeric_fields(GRPOConfig))
    fields += [(f"vllm.{n}", i, k) for n, i, k in _numeric_fields(VLLMGenerationConfig)]
    return fields


def test_every_numeric_field_has_a_range_and_floats_are_finite() -> None:
    """A field added without a bound (or a float without the finite rule) fails here."""
    fields = _every_numeric_field()
    assert len(fields) >= 30, [f for f, _, _ in fields]
    unbounded = [
        name
        for name, info, _ in fields
        if not any(isinstance(m, annotated_types.Ge | annotated_types.Gt) for m in info.metadata)
    ]
    assert not unbounded, f"numeric fields without a lower bound: {unbounded}"


def _refusal_of(dotted: str, value: Any) -> str:
    """The error text of setting ``dotted`` (``vllm.X``: the vLLM backend's own config)."""
    from vfops.training._vllm_server import VLLMGenerationConfig

    try:
        if dotted.startswith("vllm."):
            VLLMGenerationConfig.from_data({dotted[5:]: value}, source="vllm")
        else:
            config = GRPOConfig.from_data(
                {"model": {"path": "m"}, "environment": {"id": "lucky_digit"}}, source="c"
            )
            config.with_overrides({dotted: value})
    except ConfigError as exc:
        return str(exc)
    raise AssertionError(f"{dotted} = {value!r} was accepted")


@pytest.mark.parametrize(
    ("dotted", "info", "kind"),
    _every_numeric_field(),
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_every_numeric_field_refuses_values_outside_its_range(
    dotted: str, info: Any, kind: type
) -> None:
    where = dotted[5:] if dotted.startswith("vllm.") else "[{}].{}".format(*dotted.split("."))
    for bound in info.metadata:
        if isinstance(bound, _BOUND_TYPES):
            value, words = _outside(bound, kind)
            text = _refusal_of(dotted, value)
            assert f"{where}: {words}" in text, text
    if kind is float:
        for value in (math.inf, -math.inf, math.nan):
            text = _refusal_of(dotted, value)
            assert f"{where}: must be a finite number" in text, text
