"""Model and accelerate set-up: what the recipe builds once, before the first step.

Heavy module (torch, transformers, accelerate; peft for LoRA), imported lazily by
the recipe. Each function builds one thing from its config section and returns it,
so the recipe's ``setup()`` reads as the list of parts in order (the order matters:
the seed first, the model before the optimizer, the optimizer's ``prepare`` before
the in-process backend copies the weights):

- :func:`build_accelerator`: ``[run]`` precision and DeepSpeed, ``[optim]`` micro-batches;
- :func:`attention`: ``[model] attn_implementation`` resolved for this device;
- :func:`load_model`: ``[model]`` (a tiny one built when asked) with those attention
  kernels, ``[lora]``, the frozen reference model when ``[loss] beta > 0``, gradient
  checkpointing;
- :func:`prepare_policy`: AdamW and the LR schedule (``[optim]``), all wrapped by accelerate;
- :func:`load_train_examples` and :func:`build_backend`: the data and the generation side.
"""

from __future__ import annotations

import importlib
import math
import os
import random
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vfops._errors import VfopsError
from vfops._quiet import name_deepspeed_accelerator
from vfops.envs import Environment, Example, iter_examples
from vfops.training._attention import resolve_attention
from vfops.training._backend import GenerationBackend
from vfops.training._config import GenerationConfig, GRPOConfig, LoraSettings
from vfops.training._loop import GenerationLoop, MainThreadCompute


@dataclass(slots=True)
class Policy:
    """The model being trained and what steps it, as accelerate prepared them."""

    accelerator: Any
    model: Any
    tokenizer: Any
    ref_model: Any
    """The frozen reference model (``[loss] beta > 0``), else None."""
    optimizer: Any
    scheduler: Any
    micro_batches: int
    """Micro-batches accumulated per optimizer step."""
    attn_implementation: str = "sdpa"
    """The attention kernels the model runs (how a packed micro-batch marks its sequences)."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    os.environ.setdefault("PYTHONHASHSEED", str(seed))


def build_accelerator(config: GRPOConfig) -> tuple[Any, int]:
    """The :class:`accelerate.Accelerator` for this run and its micro-batches per step."""
    name_deepspeed_accelerator()  # before accelerate (and through it DeepSpeed) loads
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin

    cfg = config
    total = cfg.generation.prompts_per_step * cfg.generation.group_size
    n_micro = max(1, math.ceil(total / cfg.optim.micro_batch_size))
    plugin = None
    if cfg.run.deepspeed:
        if not Path(cfg.run.deepspeed).is_file():
            raise VfopsError(
                f"[run] deepspeed = {cfg.run.deepspeed!r} does not exist; point it at a "
                "DeepSpeed JSON such as configs/deepspeed/zero2.json"
            )
        plugin = DeepSpeedPlugin(
            hf_ds_config=cfg.run.deepspeed, gradient_accumulation_steps=n_micro
        )
        _fill_deepspeed_autos(plugin.deepspeed_config, config, n_micro)
    accelerator = Accelerator(
        # without a GPU, cpu=True is what makes several launched processes one
        # gloo process group (accelerate's MULTI_CPU) instead of N lone copies;
        # DeepSpeed sets up its own (gloo on a CPU), and cpu=True would bypass it
        cpu=plugin is None and not torch.cuda.is_available(),
        mixed_precision=_mixed_precision(cfg.run.precision),
        gradient_accumulation_steps=n_micro,
        step_scheduler_with_optimizer=False,
        deepspeed_plugin=plugin,
    )
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != accelerator.num_processes:
        # e.g. DeepSpeed with several processes on a machine without GPUs: accelerate
        # leaves each process alone, which would train N unsynchronised copies
        raise VfopsError(
            f"{launched} processes were launched but accelerate joined "
            f"{accelerator.num_processes}; several DeepSpeed processes need GPUs: "
            "on a CPU drop --deepspeed, or run it with --num-processes 1"
        )
    return accelerator, n_micro


def _fill_deepspeed_autos(ds: dict[str, Any], cfg: GRPOConfig, n_micro: int) -> None:
    """The DeepSpeed JSON's ``"auto"`` batch sizes and clipping, from this config."""
    if ds.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        ds["train_micro_batch_size_per_gpu"] = cfg.optim.micro_batch_size
    if ds.get("train_batch_size", "auto") == "auto":
        # DeepSpeed checks micro x accumulation x world; the launcher sets WORLD_SIZE
        world = int(os.environ.get("WORLD_SIZE", "1"))
        ds["train_batch_size"] = ds["train_micro_batch_size_per_gpu"] * n_micro * world
    if ds.get("gradient_clipping", "auto") == "auto":
        ds["gradient_clipping"] = cfg.optim.max_grad_norm


def attention(config: GRPOConfig, accelerator: Any) -> str:
    """``[model] attn_implementation`` resolved for the accelerator's device and precision
    (before the model loads: a missing flash-attn fails here, in one line)."""
    return resolve_attention(
        config,
        cuda=accelerator.device.type == "cuda",
        mixed_precision=str(accelerator.mixed_precision),
    )


def load_model(
    config: GRPOConfig, accelerator: Any, attn_implementation: str
) -> tuple[Any, Any, Any]:
    """(model in train mode, tokenizer, frozen reference model or None) from ``[model]``,
    loaded with ``attn_implementation`` (:func:`attention`; the reference model is a copy,
    so it runs the same kernels)."""
    import transformers

    from vfops.local import quiet_progress

    cfg = config
    path = Path(cfg.model.path)
    if not path.is_dir():
        if not (cfg.model.build_tiny_if_missing or cfg.model.gguf):
            raise VfopsError(
                f"[model] path {str(path)!r} does not exist; build one with "
                "`vfops model build-tiny DIR`, import one with `vfops model import`, or set "
                "build_tiny_if_missing = true or gguf = FILE"
            )
        from vfops.local import build_tiny_model, import_gguf

        if accelerator.is_main_process:
            if cfg.model.gguf:
                import_gguf(cfg.model.gguf, path)
            else:
                build_tiny_model(path, seed=cfg.model.tiny_seed)
        accelerator.wait_for_everyone()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    with quiet_progress():  # no "Loading weights" bar: the run prints its own lines
        model: Any = transformers.AutoModelForCausalLM.from_pretrained(
            str(path),
            local_files_only=True,
            dtype=torch.float32,
            attn_implementation=attn_implementation,
        )
    ref_model = frozen_copy(model).to(accelerator.device) if cfg.loss.beta > 0 else None
    if cfg.run.gradient_checkpointing:
        # transformers 5.2x renamed it (the old name warns); older releases lack the new one
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable({"use_reentrant": False})
    if cfg.lora.enabled:
        with warnings.catch_warnings():
            # peft 0.21 reads transformers' deprecated ``is_gradient_checkpointing``.
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
            model = _with_lora(model, cfg.lora)
    model.train()
    return model, tokenizer, ref_model


def _with_lora(model: Any, lora: LoraSettings) -> Any:
    from peft import LoraConfig, get_peft_model

    try:
        return get_peft_model(
            model,
            LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=list(lora.target_modules),
                task_type="CAUSAL_LM",
            ),
        )
    except ValueError as exc:
        # the config check reads the model's files; a model built at load time
        # (build_tiny_if_missing) or an unsupported module kind is only seen by peft
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise VfopsError(
            f"[lora] target_modules {list(lora.target_modules)} do not fit the model: {first}; "
            "use module names it has (e.g. q_proj, v_proj) or 'all-linear'"
        ) from None


def prepare_policy(
    config: GRPOConfig,
    accelerator: Any,
    model: Any,
    *,
    tokenizer: Any,
    ref_model: Any,
    micro_batches: int,
    attn_implementation: str,
) -> Policy:
    """AdamW over the trainable parameters and the ``[optim]`` LR schedule; the model,
    optimizer and schedule wrapped by ``accelerator.prepare``."""
    import transformers

    cfg = config.optim
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        weight_decay=cfg.weight_decay,
    )
    scheduler = transformers.get_scheduler(
        cfg.scheduler,
        optimizer,
        num_warmup_steps=cfg.warmup_steps,
        num_training_steps=max(config.run.steps, 1),
    )
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return Policy(
        accelerator,
        model,
        tokenizer,
        ref_model,
        optimizer,
        scheduler,
        micro_batches,
        attn_implementation,
    )


def load_train_examples(env: Environment) -> list[Example]:
    """The environment's train split, all of it (the data order is drawn from it per epoch)."""
    dataset = env.dataset
    if dataset is None:
        raise VfopsError(
            f"environment {env.name!r} has no train split; pick an environment with a "
            "dataset or pass num_train_examples in [environment] args"
        )
    examples = list(iter_examples(dataset))
    if not examples:
        raise VfopsError(f"environment {env.name!r} has an empty train split")
    return examples


def build_backend(
    config: GRPOConfig, model: Any, tokenizer: Any, loop: GenerationLoop
) -> GenerationBackend:
    """The ``[generation] backend``: in-process ``hf`` generating with a copy of ``model``
    (unwrapped), or a ``vllm`` server. No initial sync: the hf backend copies the weights
    it is built from, and a vLLM server starts from the same base model."""
    cfg: GenerationConfig = config.generation
    if cfg.backend == "hf":
        from vfops.training._generation_hf import HFBackend

        hf = HFBackend(
            model,
            tokenizer,
            max_batch_size=cfg.max_batch_size,
            multiturn_tokens=cfg.multiturn_tokens,
            seed=config.run.seed,
        )
        if cfg.async_steps == 0:  # nothing overlaps: one thread runs all torch work
            loop.main_compute = MainThreadCompute()
            hf.run_compute = loop.main_compute.run
        return hf
    # Imported only for this backend: it needs the vLLM server, not torch.
    vllm: Any = importlib.import_module("vfops.training._vllm")
    vllm_config = vllm.VLLMGenerationConfig(
        base_url=cfg.base_url,
        sync=cfg.sync,
        sync_dir=cfg.sync_dir or str(Path(config.run.output_dir) / "weights"),
        api_key_var=cfg.api_key_var,
    )
    backend: GenerationBackend = vllm.VLLMBackend.from_config(
        vllm_config, tokenizer, multiturn_tokens=cfg.multiturn_tokens
    )
    return backend


def frozen_copy(model: Any) -> Any:
    """A deep copy in eval mode with no gradients (the reference model, the export base)."""
    import copy

    clone = copy.deepcopy(model)
    clone.eval()
    for p in clone.parameters():
        p.requires_grad_(False)
    return clone


def _mixed_precision(precision: str) -> str:
    if precision == "bf16":
        return "bf16"
    if precision == "fp32":
        return "no"
    cuda_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return "bf16" if cuda_bf16 else "no"
