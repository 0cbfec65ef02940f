"""vfops side of ``bench/train_step.py``: ``GRPORecipe.train_step()`` on the shared workload.

Runs in the project venv, started by ``bench/train_step.py`` as a subprocess:

    .venv/bin/python bench/train_step_vfops.py WORKLOAD.json RESULT.json

Builds the recipe from the TOML-shaped config in ``WORKLOAD.json`` (the example
config ``configs/train/cpu_lucky_digit.toml`` with the bench's overrides:
model folder, output folder, steps, tracking off), writes the prompts of every
step it will train on (``prompts_file``, JSONL in training order, read by the
TRL side), then times each ``train_step()`` call from outside (wall clock) and
keeps the recipe's own per-step metrics (generation / training / weight-sync
seconds, tokens).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import _stepclock  # bench/ is sys.path[0] when this file runs as a script

PROCESS_START = time.perf_counter()


def _step_prompts(recipe: Any, steps: int) -> list[dict[str, Any]]:
    """The prompts of batches 0..steps-1, in the order vfops trains on them.

    From ``GRPORecipe.step_examples`` (a seeded permutation per epoch).
    """
    per_step = recipe.config.generation.prompts_per_step
    examples = [ex for i in range(steps) for ex in recipe.step_examples(i)]
    return [
        {
            "step": i // per_step,
            "example_id": ex.example_id,
            "prompt": [dict(m) for m in ex.prompt],
            "digit": str(ex.info["digit"]),
        }
        for i, ex in enumerate(examples)
    ]


def effective_settings(recipe: Any, torch: Any) -> dict[str, Any]:
    """What the recipe runs with, read back from the model and config it built, under
    the names ``bench/train_step.py`` compares with the TRL side's."""
    cfg = recipe.config
    model = recipe.policy_model
    mixed = str(recipe.accelerator.mixed_precision)
    return {
        "gradient_checkpointing": bool(getattr(model, "is_activation_checkpointing", False)),
        "parameter_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "autocast": "none" if mixed == "no" else mixed,
        "torch_threads": torch.get_num_threads(),
        "completions_per_step": cfg.generation.prompts_per_step * cfg.generation.group_size,
        "micro_batch_size": cfg.optim.micro_batch_size,
        "group_size": cfg.generation.group_size,
        "max_completion_tokens": cfg.generation.max_tokens,
        "temperature": float(cfg.generation.temperature),
        "loss_type": cfg.loss.type,
        "kl_beta": float(cfg.loss.beta),
        "clip": f"{cfg.loss.clip_low:g}/{cfg.loss.clip_high:g}",
        "advantage_scaling": "group" if cfg.loss.scale_rewards else "none",
        "truncated_in_loss": not cfg.loss.mask_truncated,
        "updates_per_batch": 1,
        "learning_rate": float(cfg.optim.lr),
        "max_grad_norm": float(cfg.optim.max_grad_norm),
    }


def main() -> None:
    workload_path, result_path = Path(sys.argv[1]), Path(sys.argv[2])
    w: dict[str, Any] = json.loads(workload_path.read_text())

    import torch

    torch.set_num_threads(int(w["threads"]))
    import transformers

    import vfops
    from vfops.training import GRPORecipe, config_from_dict

    transformers.logging.set_verbosity_error()
    setup_started = time.perf_counter()
    config = config_from_dict(w["vfops_config"], source="bench workload").validate()
    total_steps = int(w["warmup_steps"]) + int(w["measure_steps"])
    recipe = GRPORecipe(config)
    recipe.setup()
    setup_s = time.perf_counter() - setup_started

    settings = effective_settings(recipe, torch)
    prompts = _step_prompts(recipe, total_steps)
    Path(w["prompts_file"]).write_text("".join(json.dumps(r) + "\n" for r in prompts))

    # How the HF backend batches generation: sizes and seconds of its sample() calls
    # (the token loop; the rest of the generation time is the rollout machinery:
    # chat template, tokenising, scoring, turning states into sequences).
    batch_sizes: list[int] = []
    sample_seconds: list[float] = []
    backend: Any = recipe.backend
    original_sample = getattr(backend, "sample", None)
    if original_sample is not None:

        def counting_sample(batch: list[Any]) -> Any:
            batch_sizes.append(len(batch))
            started = time.perf_counter()
            try:
                return original_sample(batch)
            finally:
                sample_seconds.append(time.perf_counter() - started)

        backend.sample = counting_sample

    steps: list[dict[str, float]] = []
    try:
        for _ in range(total_steps):
            before = len(batch_sizes)
            started = _stepclock.read()
            metrics = recipe.train_step()
            clock = _stepclock.delta(started, _stepclock.read())
            generated = metrics["completion_tokens"]
            steps.append(
                {
                    **clock,
                    "step_s": metrics["step_s"],
                    "generation_s": metrics["generation_s"],
                    "training_s": metrics["training_s"],
                    "weight_sync_s": metrics["weight_sync_s"],
                    "completion_tokens": float(round(generated)),
                    "trained_tokens": metrics["trained_tokens"],
                    "sequences": metrics["sequences"],
                    "reward_mean": metrics["reward_mean"],
                    "loss": metrics["loss"],
                    "grad_norm": metrics["grad_norm"],
                    "generate_calls": float(len(batch_sizes) - before),
                    "sample_s": sum(sample_seconds[before:]),
                }
            )
    finally:
        recipe.close()

    result = {
        "side": "vfops",
        "steps": steps,
        "generate_batch_sizes": batch_sizes,
        "setup_s": setup_s,
        "process_s": time.perf_counter() - PROCESS_START,
        "settings": settings,
        "threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
        "versions": {
            "vfops": getattr(vfops, "__version__", "-"),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
    }
    result_path.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
