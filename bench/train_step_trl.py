"""TRL side of ``bench/train_step.py``: ``trl.GRPOTrainer`` steps on the shared workload.

Runs in ``.bench/trl-venv`` (torch, transformers, trl; no vfops), started by
``bench/train_step.py`` as a subprocess:

    .bench/trl-venv/bin/python bench/train_step_trl.py WORKLOAD.json RESULT.json

``WORKLOAD.json`` holds the tiny model folder, the prompts file (JSONL, one row
per prompt in training order, written by the vfops side from the batches vfops
trains on) and the hyper-parameters both sides share. The reward (``reward``) is the
lucky_digit environment's ``digit_fraction`` or reverse_text's ``lcs_ratio``,
re-implemented here as plain TRL reward functions. With ``lora`` (r, alpha,
target_modules) TRL trains peft adapters; with ``save_dir`` the trained model is saved
there at the end (adapters merged), for ``bench/real_model_trl.py`` to evaluate. Per
optimizer step it records the wall time between the ends of consecutive optimizer
steps (``on_step_end``), the time spent in ``_generate_and_score_completions``
(generation + reward + advantages) and the completion tokens sampled
(``completion_mask.sum()``, EOS included).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import _stepclock  # bench/ is sys.path[0] when this file runs as a script

PROCESS_START = time.perf_counter()


def digit_fraction(completions: list[Any], digit: list[str], **_: Any) -> list[float]:
    """lucky_digit's reward: fraction of the reply's non-space characters that are the digit."""
    out: list[float] = []
    for completion, d in zip(completions, digit, strict=True):
        if isinstance(completion, list):  # conversational: [{"role": "assistant", ...}]
            text = "".join(
                str(m.get("content") or "") for m in completion if m.get("role") == "assistant"
            )
        else:
            text = str(completion)
        visible = [c for c in text if not c.isspace()]
        out.append(sum(1 for c in visible if c == str(d)) / len(visible) if visible else 0.0)
    return out


def _reply(completion: Any) -> str:
    if isinstance(completion, list):  # conversational: [{"role": "assistant", ...}]
        return "".join(
            str(m.get("content") or "") for m in completion if m.get("role") == "assistant"
        )
    return str(completion)


def lcs_ratio(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """reverse_text's reward: difflib's ratio of the stripped reply to the reversed text."""
    import difflib

    return [
        difflib.SequenceMatcher(None, _reply(c).strip(), a).ratio()
        for c, a in zip(completions, answer, strict=True)
    ]


REWARDS = {"digit_fraction": digit_fraction, "lcs_ratio": lcs_ratio}
COLUMNS = {"digit_fraction": "digit", "lcs_ratio": "answer"}


def effective_settings(model: Any, args: Any, torch: Any) -> dict[str, Any]:
    """What this trainer runs with, read back at the start of training (the Trainer turns
    checkpointing on there), under the names ``bench/train_step.py`` compares."""
    checkpointing = getattr(model, "is_activation_checkpointing", None)
    if checkpointing is None:
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    return {
        "gradient_checkpointing": bool(checkpointing),
        "parameter_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "autocast": "bf16" if args.bf16 else "fp16" if args.fp16 else "none",
        "torch_threads": torch.get_num_threads(),
        "completions_per_step": args.per_device_train_batch_size * args.gradient_accumulation_steps,
        "micro_batch_size": args.per_device_train_batch_size,
        "group_size": args.num_generations,
        "max_completion_tokens": args.max_completion_length,
        "temperature": float(args.temperature),
        "loss_type": args.loss_type,
        "kl_beta": float(args.beta),
        "clip": f"{args.epsilon:g}/{args.epsilon_high:g}",
        "advantage_scaling": args.scale_rewards,
        "truncated_in_loss": not args.mask_truncated_completions,
        "updates_per_batch": args.num_iterations,
        "learning_rate": float(args.learning_rate),
        "max_grad_norm": float(args.max_grad_norm),
    }


def main() -> None:
    workload_path, result_path = Path(sys.argv[1]), Path(sys.argv[2])
    w: dict[str, Any] = json.loads(workload_path.read_text())
    threads = int(w["threads"])

    import torch

    torch.set_num_threads(threads)
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    transformers.logging.set_verbosity_error()
    setup_started = time.perf_counter()
    rows = [json.loads(line) for line in Path(w["prompts_file"]).read_text().splitlines() if line]
    total_steps = int(w["warmup_steps"]) + int(w["measure_steps"])
    per_step = int(w["prompts_per_step"])
    if len(rows) < total_steps * per_step:
        raise SystemExit(f"prompts file has {len(rows)} rows; need {total_steps * per_step}")
    reward = str(w.get("reward", "digit_fraction"))
    column = COLUMNS[reward]
    dataset = Dataset.from_list(
        [{"prompt": r["prompt"], column: r[column]} for r in rows[: total_steps * per_step]]
    )

    tokenizer = AutoTokenizer.from_pretrained(w["model_dir"], local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        w["model_dir"], local_files_only=True, dtype=torch.float32
    )

    micro, accum = int(w["micro_batch_size"]), int(w["grad_accum"])
    config = GRPOConfig(
        output_dir=str(Path(w["output_dir"]) / "trl"),
        # batch: generation_batch_size = micro * steps_per_generation = prompts * group
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum,
        steps_per_generation=accum,
        num_generations=int(w["group_size"]),
        num_iterations=1,
        shuffle_dataset=False,  # rows are already in vfops' training order
        # sampling
        max_completion_length=int(w["max_tokens"]),
        temperature=float(w["temperature"]),
        top_p=1.0,
        top_k=0,
        use_vllm=False,
        # loss
        loss_type=str(w["loss_type"]),
        beta=float(w["beta"]),
        epsilon=float(w["clip_low"]),
        epsilon_high=float(w["clip_high"]),
        scale_rewards="group" if w["scale_rewards"] else "none",
        mask_truncated_completions=bool(w["mask_truncated"]),
        # optimizer
        learning_rate=float(w["lr"]),
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=float(w["adam_beta1"]),
        adam_beta2=float(w["adam_beta2"]),
        weight_decay=float(w["weight_decay"]),
        max_grad_norm=float(w["max_grad_norm"]),
        # run
        max_steps=total_steps,
        seed=int(w["seed"]),
        use_cpu=True,
        bf16=False,  # TRL 1.16's default is True; vfops on a CPU trains in fp32
        fp16=False,
        # TRL 1.16's default is on, vfops' off: set from the workload, the same on both
        activation_checkpointing=bool(w["gradient_checkpointing"]),
        activation_checkpointing_kwargs={"use_reentrant": False},
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
    )

    step_ends: list[_stepclock.Reading] = []
    settings: dict[str, Any] = {}
    generations: list[dict[str, float]] = []
    entries: list[dict[str, float]] = []
    order_mismatches: list[int] = []  # generation batches whose prompts differ from vfops' step

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            settings.update(effective_settings(kwargs["model"], args, torch))
            step_ends.append(_stepclock.read())

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step_ends.append(_stepclock.read())

        def on_log(
            self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any
        ) -> None:
            entries.append(
                {k: float(v) for k, v in (logs or {}).items() if isinstance(v, int | float)}
            )

    class TimedGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
        def _generate_and_score_completions(self, inputs: Any) -> Any:
            index = len(generations)
            expected = [r["prompt"][-1]["content"] for r in rows[index * per_step :][:per_step]]
            got = list(dict.fromkeys(x["prompt"][-1]["content"] for x in inputs))
            if got != list(dict.fromkeys(expected)):
                order_mismatches.append(index)
            started = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            generations.append(
                {
                    "generation_s": time.perf_counter() - started,
                    "completion_tokens": float(out["completion_mask"].sum()),
                    "sequences": float(out["completion_ids"].size(0)),
                }
            )
            return out

    peft_config = None
    if w.get("lora"):
        from peft import LoraConfig

        lora = w["lora"]
        peft_config = LoraConfig(
            r=int(lora["r"]),
            lora_alpha=int(lora["alpha"]),
            lora_dropout=0.0,
            target_modules=list(lora["target_modules"]),
            task_type="CAUSAL_LM",
        )
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=[REWARDS[reward]],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimer()],
        peft_config=peft_config,
    )
    setup_s = time.perf_counter() - setup_started
    trainer.train()
    if w.get("save_dir"):
        trained = trainer.model
        if peft_config is not None:
            trained = trained.merge_and_unload()
        trained.save_pretrained(w["save_dir"])
        tokenizer.save_pretrained(w["save_dir"])

    clocks = [_stepclock.delta(a, b) for a, b in itertools.pairwise(step_ends)]
    train_logs = [entry for entry in entries if "reward" in entry]
    steps: list[dict[str, float]] = []
    for i, clock in enumerate(clocks):
        gen = generations[i] if i < len(generations) else {}
        log = train_logs[i] if i < len(train_logs) else {}
        steps.append(
            {
                **clock,
                "generation_s": gen.get("generation_s", float("nan")),
                "completion_tokens": gen.get("completion_tokens", float("nan")),
                "sequences": gen.get("sequences", float("nan")),
                "reward_mean": log.get("reward", float("nan")),
                "loss": log.get("loss", float("nan")),
                "grad_norm": log.get("grad_norm", float("nan")),
            }
        )
    result = {
        "side": "trl",
        "steps": steps,
        "generations": len(generations),
        "prompt_order_mismatches": order_mismatches,
        "setup_s": setup_s,
        "process_s": time.perf_counter() - PROCESS_START,
        "settings": settings,
        "threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
    }
    result_path.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
