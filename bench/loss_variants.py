"""The loss variants on the real-model task, seed by seed: held-out reward and time per step.

Each (variant, seed) is ``vfops.training.train`` on the shipped SmolLM2 config
(``configs/train/cpu_smollm2_reverse_text.toml``: SmolLM2-135M-Instruct, LoRA,
reverse_text) with ``[loss] type`` set to the variant and its clip bounds left at the
variant's defaults, in its own process, one after another, tracking off. With one
optimiser step per generated batch and ``importance_correction = "tis"`` (the default)
the PPO ratio is 1 and no clip ever binds, so the variants differ only in how they
aggregate tokens and whether they leave out groups without signal. ``--off-policy``
(the default here) is where the variants' ratios matter: batches generated one step
ahead (``async_steps = 1``) and ``importance_correction = "none"``, so each token's
ratio is the trainer's probability over the stale sampler's and the clip bounds bind
(the ``clip`` column says how often).

Printed per run: held-out greedy reward before the first step and after the last
(``eval_examples`` prompts, the same both times), the mean seconds per step (the
trainer's own clock: generation wait + optimiser step), the mean clip fraction and the
run's wall time; then a mean per variant over its seeds.

    .venv/bin/python bench/loss_variants.py                                # 4 variants x 3 seeds
    .venv/bin/python bench/loss_variants.py --variants grpo dapo --seeds 0 --steps 10
    .venv/bin/python bench/loss_variants.py --on-policy                    # async 0, tis
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from _train_run import train_in_child  # noqa: E402

DEFAULT_CONFIG = REPO / "configs" / "train" / "cpu_smollm2_reverse_text.toml"


def _variant_config(base: Path, loss: str, seed: int, args: argparse.Namespace, out: Path) -> str:
    """The base config's text with this loss, seed, steps and output folder; the clip
    bounds removed (each variant's own defaults apply); absolute model path."""
    data = tomllib.loads(base.read_text())
    model_path = (base.parent / data["model"]["path"]).resolve()
    lines: list[str] = []
    section = ""
    for line in base.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            section = stripped
        key = line.split("=", 1)[0].strip()
        if key in ("clip_low", "clip_high", "importance_correction", "async_steps"):
            continue
        if section == "[loss]" and key == "type":
            line = f'type = "{loss}"'
            if not args.on_policy:
                line += '\nimportance_correction = "none"'
        elif section == "[generation]" and key == "backend" and not args.on_policy:
            line += "\nasync_steps = 1"
        elif key == "seed":
            line = f"seed = {seed}"
        elif key == "steps":
            line = f"steps = {args.steps}"
        elif key == "eval_examples":
            line = f"eval_examples = {args.eval_examples}"
        elif key == "output_dir":
            line = f'output_dir = "{out}"'
        elif section == "[model]" and key == "path":
            line = f'path = "{model_path}"'
        lines.append(line)
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--variants", nargs="+", default=["grpo", "dapo", "gspo", "cispo"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--eval-examples", type=int, default=200)
    parser.add_argument("--on-policy", action="store_true", help="async_steps 0, tis")
    args = parser.parse_args()

    from vfops.local import import_gguf

    base = args.config.absolute()
    data = tomllib.loads(base.read_text())
    model = (base.parent / data["model"]["path"]).resolve()
    if data["model"].get("gguf") and not model.is_dir():
        print(f"importing {data['model']['gguf']} -> {model} (once, not timed)", flush=True)
        import_gguf(data["model"]["gguf"], model)
    (REPO / ".bench").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="loss-variants-", dir=REPO / ".bench"))
    env = {**os.environ, "VFOPS_HOME": str(work / "home")}
    env.pop("VFOPS_DATABASE_URL", None)
    mode = "on-policy (async 0, tis)" if args.on_policy else "off-policy (async 1, no correction)"
    print(f"{base.relative_to(REPO)}, {args.steps} steps, {mode}; work {work}", flush=True)
    table: dict[str, list[tuple[float, float, float, float]]] = {}
    for loss in args.variants:
        for seed in args.seeds:
            out = work / f"{loss}-seed{seed}"
            config = work / f"{loss}-seed{seed}.toml"
            config.write_text(_variant_config(base, loss, seed, args, out))
            result = work / f"{loss}-seed{seed}.json"
            started = time.perf_counter()
            done = train_in_child(config, result, env)
            wall = time.perf_counter() - started
            if done.returncode != 0:
                print(f"{loss} seed {seed}: exited {done.returncode}\n{done.stderr[-2000:]}")
                return 1
            run = json.loads(result.read_text())
            history = run["history"]
            step_s = statistics.fmean(h["step_s"] for h in history)
            clip = statistics.fmean(h["clip_fraction"] for h in history)
            before, after = run["baseline_eval_reward"], run["final_eval_reward"]
            table.setdefault(loss, []).append((before, after, step_s, clip))
            print(
                f"{loss:6s} seed {seed}: held-out {before:.3f} -> {after:.3f}; "
                f"{step_s:.2f} s/step; clip {clip:.4f}; wall {wall / 60:.1f} min",
                flush=True,
            )
    print("variant | held-out after (mean of seeds) | delta | s/step | clip fraction")
    for loss, rows in table.items():
        after = statistics.fmean(r[1] for r in rows)
        delta = statistics.fmean(r[1] - r[0] for r in rows)
        print(
            f"{loss} | {after:.3f} ({', '.join(f'{r[1]:.3f}' for r in rows)}) | "
            f"{delta:+.3f} | {statistics.fmean(r[2] for r in rows):.2f} | "
            f"{statistics.fmean(r[3] for r in rows):.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
