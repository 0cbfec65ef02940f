"""``vfops eval``: evaluate an installed environment against a model endpoint."""

from __future__ import annotations

import asyncio
import gc
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from vfops._errors import VfopsError
from vfops._jsonarg import parse_json_object
from vfops.cli._eval_display import EvalDisplay, print_summary
from vfops.evaluation import EvalRequest, new_run_dir, read_metadata, run_eval_async


def eval_command(
    env: Annotated[str, typer.Argument(help="Installed environment name (see: vfops env list).")],
    model: Annotated[
        str,
        typer.Option(
            "--model",
            "-m",
            help="Model name, an alias from --endpoints, local:DIR for an in-process model, "
            "or models:/NAME@ALIAS | models:/NAME/VERSION from the MLflow registry (in-process).",
        ),
    ],
    num_examples: Annotated[
        int, typer.Option("--num-examples", "-n", help="Examples to evaluate (-1: all).")
    ] = 5,
    rollouts_per_example: Annotated[
        int, typer.Option("--rollouts-per-example", "-r", help="Rollouts per example.")
    ] = 3,
    max_concurrent: Annotated[
        int, typer.Option("--max-concurrent", "-c", help="Rollouts in flight at once.")
    ] = 32,
    sampling_args: Annotated[
        str | None,
        typer.Option("--sampling-args", "-S", help="JSON object of sampling arguments."),
    ] = None,
    env_args: Annotated[
        str | None,
        typer.Option("--env-args", "-a", help="JSON object passed to load_environment."),
    ] = None,
    temperature: Annotated[
        float | None, typer.Option("--temperature", "-T", help="Sampling temperature.")
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", "-t", help="Max tokens per model turn.")
    ] = None,
    base_url: Annotated[
        str | None, typer.Option("--base-url", "-b", help="OpenAI-compatible base URL.")
    ] = None,
    api_key_var: Annotated[
        str | None,
        typer.Option("--api-key-var", "-k", help="Environment variable holding the API key."),
    ] = None,
    endpoints: Annotated[
        Path | None, typer.Option("--endpoints", "-e", help="endpoints.toml with model aliases.")
    ] = None,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Root folder for run directories.")
    ] = Path("outputs"),
    resume: Annotated[
        str | None,
        typer.Option("--resume", "-R", help="Run id (or run directory) to finish."),
    ] = None,
    registry: Annotated[
        bool,
        typer.Option(help="Record the run in the registry (VFOPS_HOME / VFOPS_DATABASE_URL)."),
    ] = True,
    tracking: Annotated[
        bool,
        typer.Option(
            help="Log the run to MLflow (MLFLOW_TRACKING_URI, else an SQLite store under "
            "VFOPS_HOME); needs the registry. VFOPS_TRACKING=0 turns it off.",
        ),
    ] = True,
    request_timeout: Annotated[
        float, typer.Option(help="Seconds before one model request times out (then retried).")
    ] = 600.0,
    max_retries: Annotated[
        int, typer.Option(help="Retries per request on 429/5xx/timeouts/connection errors.")
    ] = 5,
    pass_threshold: Annotated[
        float, typer.Option(help="A rollout passes (for pass@k) when reward >= this.")
    ] = 1.0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Run N examples x R rollouts and save every trace as it completes."""
    sampling = parse_json_object(sampling_args, "--sampling-args")
    if temperature is not None:
        sampling["temperature"] = temperature
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    arguments = parse_json_object(env_args, "--env-args")
    code = asyncio.run(
        _evaluate(
            env_name=env,
            model=model,
            request_args={
                "num_examples": num_examples,
                "rollouts_per_example": rollouts_per_example,
                "max_concurrent": max_concurrent,
                "sampling_args": sampling,
                "env_args": arguments,
                "pass_threshold": pass_threshold,
            },
            base_url=base_url,
            api_key_var=api_key_var,
            endpoints=endpoints,
            request_timeout=request_timeout,
            max_retries=max_retries,
            output=output,
            resume=resume,
            registry=registry,
            tracking=tracking,
            quiet=quiet,
        )
    )
    if code:
        raise typer.Exit(code)


async def _evaluate(
    *,
    env_name: str,
    model: str,
    request_args: dict[str, Any],
    base_url: str | None,
    api_key_var: str | None,
    endpoints: Path | None,
    request_timeout: float,
    max_retries: int,
    output: Path,
    resume: str | None,
    registry: bool,
    quiet: bool,
    tracking: bool = False,
) -> int:
    from vfops.cli._connect import connect
    from vfops.envs import load_environment
    from vfops.envs._loading import environment_version

    EvalRequest(env_name=env_name, model=model, **request_args).validate()
    environment = load_environment(env_name, **request_args["env_args"])
    if resume is not None and not registry:
        read_metadata(Path(resume))  # fail fast with a clear message on a wrong folder
    engine = _registry_engine() if registry else None
    track = engine is not None and tracking and _tracking_enabled()
    if track:
        from vfops.tracking import check_tracking

        check_tracking()  # a one-line error now, not after the eval
    connection = await connect(
        model,
        base_url=base_url,
        api_key_var=api_key_var,
        endpoints_file=endpoints,
        timeout_s=request_timeout,
        max_retries=max_retries,
    )
    try:
        request = EvalRequest(
            env_name=env_name,
            model=connection.model,
            base_url=connection.base_url,
            env_version=environment_version(env_name),
            **request_args,
        )
        request.validate()
        total = _planned_rollouts(environment, request)
        display = EvalDisplay(total=total, enabled=not quiet and sys.stderr.isatty())
        # Everything loaded so far (modules, the dataset) lives for the whole run:
        # moving it out of the collector's reach keeps collections short.
        gc.collect()
        gc.freeze()
        run_label = resume or "the run directory"
        with display:
            try:
                if engine is not None:
                    from vfops.evaluation._tracked import run_tracked_eval_async

                    tracked, result = await run_tracked_eval_async(
                        environment,
                        connection.client,
                        request,
                        output_root=output,
                        resume=resume,
                        on_group=display.update,
                        engine=engine,
                    )
                    run_label = tracked.run_id
                    if track:
                        await _log_to_mlflow(engine, tracked.run_id)
                else:
                    run_dir = (
                        Path(resume) if resume else new_run_dir(output, env_name, request.model)
                    )
                    run_label = str(run_dir)
                    result = await run_eval_async(
                        environment,
                        connection.client,
                        request,
                        run_dir=run_dir,
                        resume=resume is not None,
                        on_group=display.update,
                    )
            except asyncio.CancelledError:
                metadata = _latest_metadata(output, env_name, request.model)
                run_label = str(metadata.get("run_id") or run_label)
                print(
                    f"interrupted: completed rollouts are kept; finish with: "
                    f"vfops eval {env_name} -m {model} ... --resume {run_label}",
                    file=sys.stderr,
                )
                return 130
        print_summary(result)
        return 0
    finally:
        await connection.client.aclose()
        await environment.aclose()


def _tracking_enabled() -> bool:
    from vfops.tracking import tracking_enabled

    return tracking_enabled()


async def _log_to_mlflow(engine: Any, run_id: str) -> None:
    """Log the finished run to MLflow; a failure is a warning (the run is in the registry)."""
    from vfops.tracking import log_eval_run

    try:
        await asyncio.to_thread(log_eval_run, engine, run_id)
    except Exception as exc:  # the eval itself succeeded: report, do not fail it
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"warning: could not log run {run_id} to MLflow: {first}", file=sys.stderr)


def _registry_engine() -> Any:
    from vfops.registry import get_engine

    return get_engine()


def _latest_metadata(output: Path, env_name: str, model: str) -> dict[str, Any]:
    safe_model = model.replace("/", "_").replace(":", "_")
    runs = sorted((output / "evals" / f"{env_name}--{safe_model}").glob("*/metadata.json"))
    return read_metadata(runs[-1].parent) if runs else {}


def _planned_rollouts(environment: Any, request: EvalRequest) -> int:
    dataset = environment.eval_dataset
    if dataset is None:
        raise VfopsError(f"environment '{request.env_name}' has no dataset to evaluate")
    examples = len(dataset) if request.num_examples < 0 else min(request.num_examples, len(dataset))
    return examples * request.rollouts_per_example
