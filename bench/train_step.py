"""GRPO train-step benchmark: vfops' ``GRPORecipe`` vs TRL's ``GRPOTrainer`` on CPU.

Both sides train the same tiny model (``vfops.local.build_tiny_model``, one
folder built here with the project venv) on the same workload: the lucky_digit
environment's training prompts (chat messages: system + user), in the order
vfops trains on them, the same prompts per step, group size
(TRL: ``num_generations``), completion-token cap, temperature, learning rate,
AdamW betas, micro-batch / gradient accumulation, grad clipping, fp32, loss
(``loss_type`` "grpo", beta 0, epsilon clip 0.2/0.2, group-std scaled
advantages, truncated completions kept), in-process generation on both
(vfops: the ``hf`` backend; TRL: ``use_vllm=False``, i.e. ``model.generate``),
async generation off on both. The workload is the example config
``configs/train/cpu_lucky_digit.toml`` with the bench's overrides.

Each side runs as its own subprocess, one after the other (never together:
the machine has 2 cores), with the same ``torch.set_num_threads`` and
``OMP_NUM_THREADS``:

* ``bench/train_step_vfops.py`` (project venv): ``GRPORecipe.setup()``, then
  ``train_step()`` W + K times, each timed from outside; it also writes the
  prompts of every step (JSONL) for the TRL side;
* ``bench/train_step_trl.py`` (``.bench/trl-venv``, created on first use with
  ``torch==2.13.0`` (the CPU build on local disk) then ``trl==TRL_VERSION``):
  ``GRPOTrainer.train()`` for W + K steps; step time = wall time between the
  ends of consecutive optimizer steps.

After W warm-up steps it reports, over the K measured steps: the median step
wall time, the median time in generation (vfops: the batch's rollouts incl.
scoring; TRL: ``_generate_and_score_completions``, generation + rewards +
advantages), the rest of the step, completion tokens per step (sampled tokens,
EOS included) and tokens/s = completion tokens per step / step wall time
(median over steps), the same definition on both sides; then the ratios
vfops/TRL.

Rounds (default 3) alternate the sides' order; before each run it waits for the
machine to be idle (it is shared), and it reports which steps other processes
disturbed (``others``, ``quiet`` columns).

    .venv/bin/python bench/train_step.py              # full run (~2 min + set-up once)
    .venv/bin/python bench/train_step.py --quick      # smoke run: 1 round, 1 warm-up + 3 steps
    .venv/bin/python bench/train_step.py --threads 1  # both sides on one torch thread
    .venv/bin/python bench/train_step.py --json out.json --steps 50
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import _stepclock  # bench/ is sys.path[0] when this file runs as a script
from _venvs import ensure_venv, venv_versions

TRL_VERSION = "1.16.0"
PEFT_VERSION = "0.21.2"
"""LoRA on the TRL side (``bench/real_model_trl.py``): the project venv's peft."""
TORCH_VERSION = "2.13.0"
"""Installed first, so pip takes the CPU wheel from local disk instead of a CUDA build."""

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / ".bench"
TRL_VENV = BENCH_DIR / "trl-venv"
TRL_PYTHON = TRL_VENV / "bin" / "python"
CONFIG = ROOT / "configs" / "train" / "cpu_lucky_digit.toml"
VFOPS_SIDE = ROOT / "bench" / "train_step_vfops.py"
TRL_SIDE = ROOT / "bench" / "train_step_trl.py"


# ---------------------------------------------------------------- setup


def _stamp() -> str:
    pins = f"torch=={TORCH_VERSION} trl=={TRL_VERSION} peft=={PEFT_VERSION}"
    return hashlib.sha256(pins.encode()).hexdigest()


def ensure_trl_venv() -> Path:
    """Create ``.bench/trl-venv`` with the CPU torch, trl and peft (cached by a stamp)."""
    # torch first: the CPU build on local disk; trl alone would pull a CUDA torch.
    python = ensure_venv(
        TRL_VENV,
        [[f"torch=={TORCH_VERSION}"], [f"trl=={TRL_VERSION}", f"peft=={PEFT_VERSION}"]],
        _stamp(),
        f"torch=={TORCH_VERSION}, trl=={TRL_VERSION}, peft=={PEFT_VERSION}",
    )
    assert python == TRL_PYTHON
    return python


def build_model(directory: Path, seed: int) -> Path:
    from vfops.local import build_tiny_model

    return build_tiny_model(directory, seed=seed)


def make_workload(args: argparse.Namespace, work: Path, model_dir: Path) -> dict[str, Any]:
    """The shared workload: the example config + overrides, and the TRL-side view of it."""
    data = tomllib.loads(CONFIG.read_text())
    data["model"].update(path=str(model_dir), build_tiny_if_missing=False)
    data["run"].update(
        output_dir=str(work / "vfops-out"),
        steps=args.warmup + args.steps,
        tracking=False,
        register_as="",
        eval_examples=0,
        save_every=0,
        eval_every=0,
    )
    gen, optim = data["generation"], data["optim"]
    gen.update(async_steps=0, backend="hf")
    if args.prompts_per_step:
        gen["prompts_per_step"] = args.prompts_per_step
    if args.group_size:
        gen["group_size"] = args.group_size
    if args.max_tokens:
        gen["max_tokens"] = args.max_tokens
        data["environment"].setdefault("args", {})["max_tokens"] = args.max_tokens
    if args.micro_batch_size:
        optim["micro_batch_size"] = args.micro_batch_size
    data["run"]["gradient_checkpointing"] = args.gradient_checkpointing == "on"

    # Validate with vfops' own config code and read the effective values back.
    from vfops.training import config_from_dict

    cfg = config_from_dict(data, source=str(CONFIG)).validate()
    total = cfg.generation.prompts_per_step * cfg.generation.group_size
    micro = cfg.optim.micro_batch_size
    if total % micro:
        raise SystemExit(
            f"prompts_per_step * group_size = {total} is not a multiple of micro_batch_size "
            f"{micro}; TRL needs equal micro-batches (pick --micro-batch-size dividing {total})"
        )
    return {
        "model_dir": str(model_dir),
        "prompts_file": str(work / "prompts.jsonl"),
        "output_dir": str(work),
        "threads": args.threads,
        "warmup_steps": args.warmup,
        "measure_steps": args.steps,
        "seed": cfg.run.seed,
        "prompts_per_step": cfg.generation.prompts_per_step,
        "group_size": cfg.generation.group_size,
        "max_tokens": cfg.generation.max_tokens,
        "temperature": cfg.generation.temperature,
        "lr": cfg.optim.lr,
        "adam_beta1": cfg.optim.adam_beta1,
        "adam_beta2": cfg.optim.adam_beta2,
        "weight_decay": cfg.optim.weight_decay,
        "max_grad_norm": cfg.optim.max_grad_norm,
        "micro_batch_size": micro,
        "grad_accum": total // micro,
        "loss_type": cfg.loss.type,
        "beta": cfg.loss.beta,
        "clip_low": cfg.loss.clip_low,
        "clip_high": cfg.loss.clip_high,
        "scale_rewards": cfg.loss.scale_rewards,
        "mask_truncated": cfg.loss.mask_truncated,
        "precision": cfg.run.precision,
        "gradient_checkpointing": cfg.run.gradient_checkpointing,
        "vfops_config": data,
    }


# ---------------------------------------------------------------- measuring


def wait_idle(timeout_s: float, max_cores: float = 0.25, window_s: float = 1.0) -> str:
    """Wait until other processes use < ``max_cores`` for 2 windows in a row (or time out).

    The machine is shared (2 cores): someone else's burst of work during a side's
    run inflates its step times (OpenMP threads wait for a descheduled peer).
    """
    started = time.perf_counter()
    calm = 0
    cores = float("nan")
    while time.perf_counter() - started < timeout_s:
        before = _stepclock.read()
        time.sleep(window_s)
        after = _stepclock.read()
        cores = (after.busy - before.busy) / (after.wall - before.wall)
        calm = calm + 1 if cores < max_cores else 0
        if calm >= 2 or cores != cores:  # NaN: no /proc/stat, nothing to wait for
            return f"idle after {time.perf_counter() - started:.0f} s"
    return f"still busy ({cores:.2f} cores) after {timeout_s:.0f} s, running anyway"


def run_side(
    name: str,
    python: Path,
    script: Path,
    workload: Path,
    work: Path,
    round_index: int,
    idle_timeout_s: float,
) -> dict[str, Any]:
    threads = json.loads(workload.read_text())["threads"]
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONHASHSEED="0",
        WANDB_DISABLED="true",
    )
    result_file = work / f"{name}-r{round_index}-result.json"
    log_file = work / f"{name}-r{round_index}.log"
    idle = wait_idle(idle_timeout_s) if idle_timeout_s > 0 else "no wait"
    print(f"  round {round_index + 1}: {name} ({idle}) ...", flush=True)
    started = time.perf_counter()
    with log_file.open("w") as log:
        done = subprocess.run(
            [str(python), str(script), str(workload), str(result_file)],
            cwd=str(ROOT),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    wall = time.perf_counter() - started
    if done.returncode != 0 or not result_file.exists():
        tail = "\n".join(log_file.read_text().splitlines()[-30:])
        raise SystemExit(f"{name} side failed (exit {done.returncode}); last lines:\n{tail}")
    result: dict[str, Any] = json.loads(result_file.read_text())
    result["subprocess_wall_s"] = wall
    return result


QUIET_CORES = 0.1
"""A step is "quiet" when other processes used < this many cores meanwhile."""


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarise(side: str, results: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Pool the measured steps (after ``warmup``) of every round of one side."""
    measured = [step for r in results for step in r["steps"][warmup:]]
    if not measured:
        raise SystemExit(f"{side}: no measured steps")

    def col(key: str, steps: list[dict[str, Any]] = measured) -> list[float]:
        return [float(s[key]) for s in steps if key in s]

    def rate(steps: list[dict[str, Any]]) -> list[float]:
        return [float(s["completion_tokens"]) / float(s["wall_s"]) for s in steps]

    quiet = [s for s in measured if float(s["others_cpu_s"]) / float(s["wall_s"]) < QUIET_CORES]
    walls = col("wall_s")
    return {
        "side": side,
        "rounds": len(results),
        "measured_steps": len(measured),
        "step_s_median": _median(walls),
        "step_s_min": min(walls),
        "step_s_max": max(walls),
        "step_s_per_round": [_median(col("wall_s", r["steps"][warmup:])) for r in results],
        "generation_s_median": _median(col("generation_s")),
        "rest_s_median": _median([float(s["wall_s"]) - float(s["generation_s"]) for s in measured]),
        "cpu_s_median": _median(col("cpu_s")),
        "others_cores_median": _median(
            [float(s["others_cpu_s"]) / float(s["wall_s"]) for s in measured]
        ),
        "completion_tokens_median": _median(col("completion_tokens")),
        "tokens_per_s_median": _median(rate(measured)),
        "tokens_per_s_total": sum(col("completion_tokens")) / sum(walls),
        "generation_tokens_per_s_median": _median(
            [float(s["completion_tokens"]) / float(s["generation_s"]) for s in measured]
        ),
        "quiet_steps": len(quiet),
        "quiet_step_s_median": _median(col("wall_s", quiet)),
        "quiet_tokens_per_s_median": _median(rate(quiet)),
        "reward_mean_measured": statistics.fmean(col("reward_mean")),
        "warmup_s": [sum(float(s["wall_s"]) for s in r["steps"][:warmup]) for r in results],
        "setup_s": [float(r["setup_s"]) for r in results],
        "process_s": [float(r["subprocess_wall_s"]) for r in results],
        "threads": results[0]["threads"],
    }


# ---------------------------------------------------------------- report


def compare_settings(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Print what each side ran with, read back from the trainer it built (not from the
    workload), and return the comparison; a setting that differs fails the run."""
    if set(results) != {"vfops", "trl"}:
        return {}
    mine, theirs = results["vfops"][0]["settings"], results["trl"][0]["settings"]
    width = max(len(k) for k in mine)
    print()
    print(f"{'setting (read back from each trainer)':<{width + 2}} {'vfops':>24} {'TRL':>24}")
    differing = []
    for key in mine:
        a, b = mine[key], theirs.get(key, "-")
        same = a == b
        if not same:
            differing.append(key)
        print(f"  {key:<{width}} {a!s:>24} {b!s:>24}{'' if same else '   DIFFERS'}")
    return {"vfops": mine, "trl": theirs, "differing": differing}


def _ratio(a: float, b: float) -> float:
    return a / b if b and b == b and a == a else float("nan")


def report(
    summaries: list[dict[str, Any]],
    workload: dict[str, Any],
    versions: dict[str, str],
    extra: dict[str, Any],
) -> dict[str, Any]:
    w = workload
    rounds = summaries[0]["rounds"]
    print()
    print(
        f"GRPO train step, tiny Llama on CPU ({w['threads']} threads): {w['prompts_per_step']} "
        f"prompts x {w['group_size']} = {w['prompts_per_step'] * w['group_size']} "
        "completions/step, "
        f"max {w['max_tokens']} tokens, T={w['temperature']:g}, micro-batch "
        f"{w['micro_batch_size']} x {w['grad_accum']} accumulation, lr {w['lr']:g}, "
        f"loss {w['loss_type']}, beta {w['beta']:g}, clip {w['clip_low']:g}/{w['clip_high']:g}, "
        f"fp32, gradient checkpointing {'on' if w['gradient_checkpointing'] else 'off'};\n"
        f"{rounds} round(s) per side, {w['measure_steps']} measured steps each after "
        f"{w['warmup_steps']} warm-up steps (medians over the pooled measured steps)"
    )
    header = (
        f"{'side':<6} {'steps':>5} {'step s':>7} {'min':>6} {'max':>6} {'gen s':>6} "
        f"{'rest s':>6} {'CPU s':>6} {'others':>6} {'tok/step':>8} {'tok/s':>7} {'gen tok/s':>9} "
        f"{'quiet':>5} {'q step s':>8} {'q tok/s':>7} {'reward':>6}"
    )
    print(header)
    print("-" * len(header))
    for s in summaries:
        print(
            f"{s['side']:<6} {s['measured_steps']:>5} {s['step_s_median']:>7.3f} "
            f"{s['step_s_min']:>6.3f} {s['step_s_max']:>6.2f} {s['generation_s_median']:>6.3f} "
            f"{s['rest_s_median']:>6.3f} {s['cpu_s_median']:>6.3f} "
            f"{s['others_cores_median']:>6.2f} "
            f"{s['completion_tokens_median']:>8.0f} {s['tokens_per_s_median']:>7.0f} "
            f"{s['generation_tokens_per_s_median']:>9.0f} {s['quiet_steps']:>5} "
            f"{s['quiet_step_s_median']:>8.3f} {s['quiet_tokens_per_s_median']:>7.0f} "
            f"{s['reward_mean_measured']:>6.3f}"
        )
    print(
        "step s: median wall time of one optimizer step (min/max over the measured steps); gen s: "
        "generation + scoring (vfops: the\nbatch's rollouts; TRL: "
        "_generate_and_score_completions); "
        "rest s: step - gen (forward/backward, optimizer, vfops' weight sync,\nTRL's logging); "
        "CPU s: the process's CPU time per step (all threads); others: cores used by other "
        "processes during the step;\ntok/step: completion tokens sampled (EOS included); tok/s: "
        "median of tok/step / step s; gen tok/s: tok/step / gen s;\nquiet / q step s / q tok/s: "
        f"the steps during which others used < {QUIET_CORES} core, and their medians; reward: "
        "mean over the measured steps."
    )
    for s in summaries:
        print(
            f"  {s['side']}: step s per round {[round(x, 3) for x in s['step_s_per_round']]}, "
            f"warm-up s {[round(x, 2) for x in s['warmup_s']]}, set-up s "
            f"{[round(x, 2) for x in s['setup_s']]}, subprocess s "
            f"{[round(x, 1) for x in s['process_s']]}"
        )
    summary: dict[str, Any] = {"workload": {k: v for k, v in w.items() if k != "vfops_config"}}
    summary["config"] = w["vfops_config"]
    summary["sides"] = summaries
    by_side = {s["side"]: s for s in summaries}
    if "vfops" in by_side and "trl" in by_side:
        a, b = by_side["vfops"], by_side["trl"]
        ratios = {
            "step_time": _ratio(a["step_s_median"], b["step_s_median"]),
            "tokens_per_s": _ratio(a["tokens_per_s_median"], b["tokens_per_s_median"]),
            "generation_s": _ratio(a["generation_s_median"], b["generation_s_median"]),
            "rest_s": _ratio(a["rest_s_median"], b["rest_s_median"]),
            "cpu_s": _ratio(a["cpu_s_median"], b["cpu_s_median"]),
            "quiet_step_time": _ratio(a["quiet_step_s_median"], b["quiet_step_s_median"]),
            "quiet_tokens_per_s": _ratio(
                a["quiet_tokens_per_s_median"], b["quiet_tokens_per_s_median"]
            ),
        }
        print()
        print(
            f"ratio vfops/TRL: step time x{ratios['step_time']:.2f} "
            f"({'vfops faster' if ratios['step_time'] < 1 else 'vfops slower'}), tokens/s "
            f"x{ratios['tokens_per_s']:.2f}; generation time x{ratios['generation_s']:.2f}, "
            f"rest of the step x{ratios['rest_s']:.2f}, CPU per step x{ratios['cpu_s']:.2f}; "
            f"quiet steps only: step time x{ratios['quiet_step_time']:.2f}, tokens/s "
            f"x{ratios['quiet_tokens_per_s']:.2f}"
        )
        summary["ratios_vfops_over_trl"] = ratios
    for key, value in extra.items():
        print(f"{key}: {value}")
    summary.update(extra)
    print()
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    summary["versions"] = versions
    return summary


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, 1 + 3 steps")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 5)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps (default 30)")
    parser.add_argument(
        "--rounds", type=int, default=None, help="runs per side, alternating (default 3)"
    )
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="torch threads on both sides"
    )
    parser.add_argument("--prompts-per-step", type=int, default=None)
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--micro-batch-size", type=int, default=None)
    parser.add_argument(
        "--gradient-checkpointing",
        choices=["off", "on"],
        default="off",
        help="on both sides (vfops' default: off; TRL 1.16's GRPOConfig default: on)",
    )
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=60.0,
        help="before each run, wait up to this many s for the machine to be idle (0: no wait)",
    )
    parser.add_argument("--skip-trl", action="store_true", help="vfops side only")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--keep", action="store_true", help="keep the run folder under .bench/")
    args = parser.parse_args()
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 5)
    args.steps = args.steps if args.steps is not None else (3 if args.quick else 30)
    args.rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        raise SystemExit("--steps and --rounds must be >= 1, --warmup >= 0")

    trl_python = None if args.skip_trl else ensure_trl_venv()
    versions = {
        "python": platform.python_version(),
        **venv_versions(Path(sys.executable), ["vfops", "torch", "transformers", "accelerate"]),
        "cpus": str(os.cpu_count()),
    }
    if trl_python is not None:
        tv = venv_versions(trl_python, ["trl", "torch", "transformers", "accelerate"])
        versions.update({f"{k} (trl venv)": v for k, v in tv.items()})

    work = BENCH_DIR / "train_step" / time.strftime("%Y%m%dT%H%M%S")
    work.mkdir(parents=True)
    try:
        workload = make_workload(args, work, work / "tiny-model")
        tiny_seed = int(workload["vfops_config"]["model"].get("tiny_seed", 0))
        build_model(Path(workload["model_dir"]), seed=tiny_seed)
        workload_file = work / "workload.json"
        workload_file.write_text(json.dumps(workload, indent=2))
        print(f"workload in {work.relative_to(ROOT)}", flush=True)

        sides = {"vfops": (Path(sys.executable), VFOPS_SIDE)}
        if trl_python is not None:
            sides["trl"] = (trl_python, TRL_SIDE)
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
        for round_index in range(args.rounds):
            # vfops first in round 0 (it writes the prompts file), then alternate the order.
            order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
            for name in order:
                python, script = sides[name]
                results[name].append(
                    run_side(name, python, script, workload_file, work, round_index, args.wait_idle)
                )
        for r in results.get("trl", []):
            if r.get("prompt_order_mismatches"):
                print(
                    "  warning: TRL's batches differ from vfops' at generations "
                    f"{r['prompt_order_mismatches']}",
                    flush=True,
                )
        summaries = [summarise(name, rs, args.warmup) for name, rs in results.items()]
        vf = results["vfops"][0]
        sizes = vf.get("generate_batch_sizes", [])
        vf_steps = [s for r in results["vfops"] for s in r["steps"][args.warmup :]]
        sample_s = _median([float(s.get("sample_s", "nan")) for s in vf_steps])
        gen_s = _median([float(s["generation_s"]) for s in vf_steps])
        extra = {
            "vfops hf backend": (
                f"{_median([float(s.get('generate_calls', 0)) for s in vf_steps]):g} sample() "
                f"call(s) per step, batch sizes {sizes[:4]}...; median {sample_s:.3f} s in "
                f"sample() (the token loop) of {gen_s:.3f} s generation, the rest is the "
                "rollout machinery (chat template, tokenising, scoring, sequences)"
            ),
        }
        settings = compare_settings(results)
        summary = report(summaries, workload, versions, extra)
        summary["settings"] = settings
        summary["raw_steps"] = {name: [r["steps"] for r in rs] for name, rs in results.items()}
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=2))
        if settings.get("differing"):
            raise SystemExit(
                f"the sides ran with different settings ({', '.join(settings['differing'])}); "
                "the comparison is not like for like"
            )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
