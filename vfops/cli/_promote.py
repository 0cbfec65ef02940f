"""``vfops promote NAME VERSION`` / ``vfops promote history NAME`` and ``vfops model register``.

Wiring (in ``vfops/cli/_app.py`` and ``vfops/cli/_model.py``)::

    app.command("promote")(_promote.promote_command)
    _model.app.command("register")(_promote.register_command)

``promote`` is one command whose first argument is either a model name or the
keyword ``history``: ``vfops promote NAME VERSION [--alias champion] [--env ENV ...]``
runs the gate; ``vfops promote history NAME [--alias A]`` prints the decisions, a
command of its own (:class:`PromoteCommand`: its usage, arguments and ``--help``).
(A model literally named ``history`` cannot be promoted from the CLI.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperCommand

from vfops._errors import VfopsError
from vfops.cli._sampling import (
    MaxTokensOption,
    SamplingArgsOption,
    TemperatureOption,
    sampling_from_flags,
)

HISTORY = "history"


class PromoteCommand(TyperCommand):
    """``vfops promote``: ``promote history NAME ...`` is handed to :func:`history_command`
    whole, so its usage line, its arguments and its ``--help`` are its own."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args[:1] != [HISTORY]:
            return super().parse_args(ctx, args)
        history = _history_click_command()
        with history.make_context(f"{ctx.info_name} {HISTORY}", args[1:], parent=ctx.parent) as sub:
            history.invoke(sub)
        ctx.exit()
        raise AssertionError("unreachable")  # ctx.exit raises


def _history_click_command() -> Any:
    from vfops.cli._help import readable

    app = typer.Typer(add_completion=False, rich_markup_mode=None)
    app.command()(history_command)
    command = typer.main.get_command(app)  # one command: the command itself
    readable(command)
    return command


def history_command(
    name: Annotated[str, typer.Argument(help="Registered model name.")],
    alias: Annotated[
        str | None, typer.Option("--alias", help="Only this alias's decisions (default: all).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Every promotion decision recorded for NAME: when, who, which alias moved from
    which version to which, forced or not, and the evidence runs with their deltas."""
    _history(name, alias, as_json)


def register_command(
    path: Annotated[Path, typer.Argument(help="Hugging Face model folder (save_pretrained).")],
    name: Annotated[str, typer.Option("--name", help="Registered model name in MLflow.")],
    training_run: Annotated[
        str | None, typer.Option("--training-run", help="Id of the training run that made it.")
    ] = None,
    base_model: Annotated[
        str | None, typer.Option("--base-model", help="The model it was trained from.")
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", help="Environment it was trained on, NAME@VERSION (repeatable)."),
    ] = None,
) -> None:
    """Log a model folder as a new version of NAME in the MLflow model registry."""
    from vfops.models import register_checkpoint

    info = register_checkpoint(
        path,
        name=name,
        training_run_id=training_run,
        base_model=base_model,
        environment_versions=env or None,
    )
    print(f"registered {info.uri} (run {info.run_id}, source {info.source})")


def promote_command(
    name: Annotated[str, typer.Argument(help="Registered model name.")],
    version: Annotated[str, typer.Argument(help="Version to promote.")],
    alias: Annotated[str, typer.Option("--alias", help="Alias to move.")] = "champion",
    env: Annotated[
        list[str] | None,
        typer.Option("--env", "-e", help="Gate environment (repeatable)."),
    ] = None,
    num_examples: Annotated[
        int, typer.Option("--num-examples", "-n", help="Examples per gate environment.")
    ] = 20,
    rollouts_per_example: Annotated[
        int, typer.Option("--rollouts-per-example", "-r", help="Rollouts per example.")
    ] = 1,
    metric: Annotated[
        str, typer.Option("--metric", help="reward_mean, or a rubric metric name.")
    ] = "reward_mean",
    sampling_args: SamplingArgsOption = None,
    temperature: TemperatureOption = None,
    max_tokens: MaxTokensOption = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of sampling and the test.")] = 0,
    force: Annotated[
        bool, typer.Option("--force", help="Move the alias even if the gate fails (recorded).")
    ] = False,
    run: Annotated[
        list[str] | None,
        typer.Option(
            "--run",
            help="ENV=RUN_ID: an existing completed registry run of the candidate on ENV "
            "(e.g. from vfops eval ENV -m models:/NAME/VERSION) to use as its evidence "
            "(repeatable); ENV is added to the gate.",
        ),
    ] = None,
    reuse: Annotated[
        bool,
        typer.Option(
            "--reuse/--no-reuse",
            help="Use completed runs that answer the gate's exact request instead of "
            "evaluating again.",
        ),
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Promote NAME VERSION to an alias on evidence (`vfops promote history NAME`: the
    decisions so far).

    The alias moves only if the version the gate compared with still holds it: when
    another promotion moved it while the gate ran, the gate runs again against the
    new holder (the output says so), and after 5 such changes nothing is recorded
    and the command exits 4. A refusal exits 1.
    """
    if name == HISTORY:  # options before the keyword: `promote --json history NAME`
        _history(version, alias if alias != "champion" else None, as_json)
        return
    from vfops.models import PromotionRequest, promote

    args = sampling_from_flags(sampling_args, temperature, max_tokens)
    evidence = _evidence_runs(run or [])
    request = PromotionRequest(
        name,
        version,
        alias=alias,
        gate_envs=[*(env or []), *evidence],
        evidence_runs=evidence,
        reuse=reuse,
        num_examples=num_examples,
        rollouts_per_example=rollouts_per_example,
        metric=metric,
        force=force,
        sampling_args=args,
        seed=seed,
    )
    decision = promote(request)
    if as_json:
        print(json.dumps(decision.to_dict(), indent=2, default=str))
    else:
        for result in decision.envs:
            print(result.describe(metric))
        print(f"{decision.outcome}{' (forced)' if decision.forced else ''}: {decision.reason}")
    decision.raise_if_refused()


def _evidence_runs(items: list[str]) -> dict[str, str]:
    runs: dict[str, str] = {}
    for item in items:
        env, sep, run_id = item.partition("=")
        if not sep or not env.strip() or not run_id.strip():
            raise VfopsError(f"--run {item!r} is not ENV=RUN_ID; e.g. --run arithmetic=3f2a...")
        runs[env.strip()] = run_id.strip()
    return runs


def _history(name: str, alias: str | None, as_json: bool) -> None:
    from vfops.models import promotion_history

    events = promotion_history(name, alias=alias)
    if as_json:
        print(json.dumps([e.__dict__ for e in events], indent=2, default=str))
        return
    if not events:
        print(f"no promotion decisions recorded for {name}")
        return
    table = Table("#", "when", "who", "alias", "from", "to", "outcome", "forced", "evidence")
    for e in events:
        runs = ", ".join(
            f"{env}: {info.get('candidate_run_id')}"
            + (f" vs {info['holder_run_id']}" if info.get("holder_run_id") else "")
            + (f" Δ{info['delta']:+.3f}" if info.get("delta") is not None else "")
            for env, info in e.evidence.get("envs", {}).items()
        )
        table.add_row(
            str(e.id),
            e.created_at[:19],
            e.actor,
            e.alias,
            e.from_version or "-",
            e.to_version,
            e.outcome,
            "yes" if e.forced else "no",
            runs or "-",
        )
    Console(width=200).print(table)
