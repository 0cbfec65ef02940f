"""``vfops train CONFIG.toml``: GRPO training, single process or through ``accelerate launch``.

Wiring (in ``vfops/cli/_app.py``)::

    app.command("train")(_train.train_command)

One process by default. ``--num-processes N`` (data-parallel training on N
devices) or ``--deepspeed configs/deepspeed/zero2.json`` re-runs this command
under ``accelerate launch`` (which sets up torch.distributed); the child sees
``VFOPS_TRAIN_LAUNCHED`` and trains. Torch loads only once training starts.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from vfops._errors import MissingExtraError, VfopsError

LAUNCHED_ENV = "VFOPS_TRAIN_LAUNCHED"


def train_command(
    config: Annotated[
        Path, typer.Argument(help="Training config (TOML), e.g. configs/train/*.toml.")
    ],
    steps: Annotated[
        int | None, typer.Option("--steps", help="Override [run] steps.", min=0)
    ] = None,
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", help="Override [run] output_dir.")
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option("--resume", help="Resume from a checkpoint folder written by a run."),
    ] = None,
    num_processes: Annotated[
        int,
        typer.Option(
            "--num-processes", help="Training processes (GPUs) under accelerate launch.", min=1
        ),
    ] = 1,
    deepspeed: Annotated[
        Path | None,
        typer.Option(
            "--deepspeed", help="DeepSpeed JSON (configs/deepspeed/zero2.json or zero3.json)."
        ),
    ] = None,
    register_as: Annotated[
        str | None,
        typer.Option(
            "--register-as", help="Override [run] register_as: MLflow model name of the result."
        ),
    ] = None,
    no_tracking: Annotated[
        bool, typer.Option("--no-tracking", help="Do not log to MLflow.")
    ] = False,
    check: Annotated[bool, typer.Option("--check", help="Validate the config and exit.")] = False,
) -> None:
    """Train a policy with GRPO on an environment (needs the [train] extra)."""
    from vfops.training._config import load_config

    cfg = load_config(config)
    overrides: dict[str, Any] = {}
    if steps is not None:
        overrides["run.steps"] = steps
    if output_dir is not None:
        overrides["run.output_dir"] = str(output_dir.resolve())
    if deepspeed is not None:
        if not deepspeed.is_file():
            raise VfopsError(
                f"--deepspeed {str(deepspeed)!r} does not exist; use configs/deepspeed/zero2.json"
            )
        overrides["run.deepspeed"] = str(deepspeed.resolve())
    if register_as is not None:
        overrides["run.register_as"] = register_as
    if no_tracking:
        overrides["run.tracking"] = False
    cfg = cfg.with_overrides(overrides)
    if resume is not None and not resume.is_dir():
        raise VfopsError(f"--resume {str(resume)!r} is not a folder; pass a checkpoint folder")
    if check:
        typer.echo(f"{config}: ok ({cfg.environment.id}, {cfg.run.steps} steps)")
        return
    _require_train_extra()
    needs_launcher = num_processes > 1 or bool(cfg.run.deepspeed)
    if needs_launcher and not os.environ.get(LAUNCHED_ENV):
        raise typer.Exit(_launch(num_processes, sys.argv[1:]))
    _train(cfg, resume)


def _train(cfg: Any, resume: Path | None) -> None:
    from vfops.training._recipe import GRPORecipe

    with GRPORecipe(cfg) as recipe:
        recipe.setup()
        if resume is not None:
            recipe.resume(resume)
        main = recipe.accelerator.is_main_process
        result = recipe.train(_print_progress(cfg.run.steps) if main else None)
    if main:
        summary = {k: v for k, v in result.items() if k != "history"}
        typer.echo(
            f"baseline held-out reward {result['baseline_eval_reward']:.4f} -> "
            f"final {result['final_eval_reward']:.4f} after {result['steps']} steps"
        )
        typer.echo(json.dumps(summary, default=str))


def _print_progress(total: int) -> Any:
    """One line per step and eval on stderr (stdout ends with the JSON summary)."""

    def show(kind: str, step: int, m: dict[str, float]) -> None:
        if kind == "eval":
            typer.echo(f"step {step}/{total}  held-out reward {m['eval_reward']:.4f}", err=True)
            return
        typer.echo(
            f"step {step}/{total}  reward {m['reward_mean']:.3f}±{m['reward_std']:.3f}  "
            f"loss {m['loss']:+.4f}  kl {m['kl']:.4f}  clip {m['clip_fraction']:.3f}  "
            f"gen {m['generation_s']:.2f}s  train {m['training_s']:.2f}s  "
            f"sync {m['weight_sync_s']:.2f}s  {m['tokens_per_s']:.0f} tok/s",
            err=True,
        )

    return show


def _launch(num_processes: int, argv: list[str]) -> int:
    """Re-run ``vfops <argv>`` under ``accelerate launch``; returns its exit code.

    One process (DeepSpeed on a single device) needs no launcher, only the
    torch.distributed rendezvous variables, which accelerate's simple launcher
    does not set (DeepSpeed would then look for MPI).
    """
    env = {**os.environ, LAUNCHED_ENV: "1"}
    if num_processes == 1:
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        env.setdefault("MASTER_PORT", str(_free_port()))
        cmd = [sys.executable, "-m", "vfops", *argv]
        return subprocess.run(cmd, env=env, check=False).returncode
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        # accelerate's multi-process launcher (torchrun); on a machine without GPUs the
        # recipe's Accelerator(cpu=True) then joins the processes over gloo
        "--multi_gpu",
        "--num_processes",
        str(num_processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",  # the recipe chooses precision from [run] precision
        "--dynamo_backend",
        "no",
        "-m",
        "vfops",
        *argv,
    ]
    return subprocess.run(cmd, env=env, check=False).returncode


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _require_train_extra() -> None:
    for module in ("torch", "transformers", "accelerate", "peft"):
        try:
            __import__(module)
        except ImportError as exc:
            raise MissingExtraError("train", exc.name or module) from exc
