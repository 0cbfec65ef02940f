"""``vfops train CONFIG.toml``: GRPO training, a thin layer over :func:`vfops.training.train`.

``--example NAME`` instead of a file trains a config shipped inside vfops
(vfops/_examples.py): it works from a ``pip install vfops`` outside any checkout.

Wiring (in ``vfops/cli/_app.py``)::

    app.command("train")(_train.train_command)

One process by default. ``--num-processes N`` (data-parallel training on N
devices) or ``--deepspeed configs/deepspeed/zero2.json`` makes the entry point
launch the training processes under ``accelerate launch``. Progress goes to
stderr, one line per step and eval; stdout gets the result in two lines (rewards,
then where the checkpoint and its records are), or with ``--json`` the run summary
as one JSON object. Torch loads only once training starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from vfops._errors import InvalidArgumentError
from vfops._quiet import quiet_settings

if TYPE_CHECKING:
    from vfops.training import GRPOConfig, Progress, TrainResult


def train_command(
    config: Annotated[
        Path | None,
        typer.Argument(
            help="Training config (TOML), e.g. configs/train/*.toml; or --example NAME.",
            show_default=False,
        ),
    ] = None,
    example: Annotated[
        str | None,
        typer.Option(
            "--example",
            help="A config shipped inside vfops instead of CONFIG (cpu_lucky_digit, "
            "cpu_lora_example, cpu_smollm2_reverse_text[_full]); its relative paths resolve "
            "as if it were ./configs/train/NAME.toml.",
            show_default=False,
        ),
    ] = None,
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
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help=(
                "Validate the config, the --resume checkpoint and what the run needs on this "
                "machine (model folder, environment and its args), then exit."
            ),
        ),
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Keep the libraries' own output (progress bars, transformers' notices).",
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the run summary as one JSON object instead.")
    ] = False,
) -> None:
    """Train a policy with GRPO on an environment (needs the [train] extra)."""
    # before torch and transformers are imported: they read these once
    os.environ.update(quiet_settings(verbose))
    import vfops.training as training  # looked up per call: tests replace the entry point

    source, label = _config_source(config, example)
    cfg = training.resolve_config(
        source,
        steps=steps,
        output_dir=output_dir,
        deepspeed=deepspeed,
        register_as=register_as,
        tracking=False if no_tracking else None,
    )
    training.check_resume(resume)
    if check:
        training.preflight(cfg)
        typer.echo(f"{label}: ok ({cfg.environment.id}, {cfg.run.steps} steps)")
        return
    result = training.train(
        cfg,
        resume=resume,
        num_processes=num_processes,
        progress=_print_progress(cfg.run.steps, kl=cfg.loss.beta > 0),
    )
    if as_json:
        typer.echo(json.dumps(result.summary(), default=str))
        return
    typer.echo(_result_lines(result))


def _result_lines(result: TrainResult) -> str:
    """What a run produced, for a person: the rewards, then where it all is."""
    where = [f"checkpoint {result.checkpoint}"]
    if result.registered:
        where.append(f"registered {result.registered}")
    if result.mlflow_run_id:
        where.append(f"MLflow run {result.mlflow_run_id}")
    paired = result.heldout_paired
    test = ""
    if paired and result.steps:
        from vfops.stats import format_p

        test = (
            f" ({paired['heldout_delta']:+.3f}, 95% CI [{paired['heldout_delta_ci_low']:+.3f}, "
            f"{paired['heldout_delta_ci_high']:+.3f}], paired bootstrap "
            f"{format_p(paired['heldout_p_better'])} over "
            f"{int(paired['heldout_paired_examples'])} prompts)"
        )
    return (
        f"baseline held-out reward {result.baseline_eval_reward:.3f} -> "
        f"final {result.final_eval_reward:.3f} after {result.steps} "
        f"step{'' if result.steps == 1 else 's'}{test}\n" + "; ".join(where)
    )


def _config_source(config: Path | None, example: str | None) -> tuple[Path | GRPOConfig, str]:
    """The config to run (a file, or a shipped example loaded by name) and its label."""
    if config is not None and example is None:
        return config, str(config)
    if example is not None and config is None:
        from vfops.training import example_config

        return example_config(example), f"example {example}"
    raise InvalidArgumentError(
        "give one training config: CONFIG.toml or --example NAME (not both); "
        "vfops train --example cpu_lucky_digit is the CPU example"
    )


def _print_progress(total: int, *, kl: bool) -> Progress:
    """One line per step and eval on stderr (stdout holds the result).

    A step's line leads with what moves while a policy learns: its rollouts' reward and
    how many ran into ``max_tokens``, the policy's entropy and the gradient's norm. The
    GRPO loss of an on-policy step is about zero by construction (group-normalised
    advantages average to zero), so it is printed in scientific notation rather than
    rounded to a misleading ``0.0000``; KL only when the loss has a KL term (beta > 0).
    """

    def show(kind: str, step: int, m: dict[str, float]) -> None:
        if kind == "eval":
            typer.echo(f"step {step}/{total}  held-out reward {m['eval_reward']:.3f}", err=True)
            return
        typer.echo(
            f"step {step}/{total}  reward {m['reward_mean']:.3f}±{m['reward_std']:.3f}  "
            f"truncated {m['truncated_fraction']:.0%}  entropy {m['entropy']:.3f}  "
            f"grad {m['grad_norm']:.3f}  loss {m['loss']:+.2e}  "
            + (f"kl {m['kl']:.2e}  " if kl else "")
            + f"clip {m['clip_fraction']:.3f}  mismatch {m['mismatch_kl']:.1e}  "
            f"gen {m['generation_s']:.2f}s  train {m['training_s']:.2f}s  "
            f"sync {m['weight_sync_s']:.2f}s  {m['tokens_per_s']:.0f} tok/s",
            err=True,
        )

    return show
