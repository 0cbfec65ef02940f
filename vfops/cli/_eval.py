"""``vfops eval``: evaluate an installed environment against a model endpoint."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from vfops._errors import VfopsError
from vfops._image_map import parse_image_map
from vfops._jsonarg import parse_json_object
from vfops.cli._eval_display import EvalDisplay, print_summary
from vfops.cli._exit_codes import result_exit_code
from vfops.cli._sampling import (
    MaxTokensOption,
    SamplingArgsOption,
    TemperatureOption,
    sampling_from_flags,
)
from vfops.evaluation import (
    DEFAULT_MAX_ERROR_RATE,
    DEFAULT_MAX_TOOL_ERROR_RATE,
    DEFAULT_OUTPUT_ROOT,
    EvalRequest,
    ModelOptions,
    RunOptions,
    evaluate_async,
)

# The flags' defaults are the library's (defined once, on EvalRequest and ModelOptions).
_DEFAULTS = EvalRequest(env_name="", model="")
_MODEL_DEFAULTS = ModelOptions()
T = TypeVar("T")


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
    ] = _DEFAULTS.num_examples,
    rollouts_per_example: Annotated[
        int, typer.Option("--rollouts-per-example", "-r", help="Rollouts per example.")
    ] = _DEFAULTS.rollouts_per_example,
    max_concurrent: Annotated[
        int, typer.Option("--max-concurrent", "-c", help="Rollouts in flight at once.")
    ] = _DEFAULTS.max_concurrent,
    sampling_args: SamplingArgsOption = None,
    env_args: Annotated[
        str | None,
        typer.Option(
            "--env-args",
            "-a",
            help="JSON object passed to load_environment, or @FILE (.json, or .toml).",
        ),
    ] = None,
    sink: Annotated[
        list[str] | None,
        typer.Option(
            "--sink",
            help="A plug-in sink by name (vfops.eval_sinks entry points), also given every "
            "scored group and opened with the run's id, environment and content hash "
            "(repeatable).",
            show_default=False,
        ),
    ] = None,
    middleware: Annotated[
        list[str] | None,
        typer.Option(
            "--middleware",
            help="A plug-in request middleware by name (vfops.request_middleware entry "
            "points), wrapping every model request of the run (repeatable).",
            show_default=False,
        ),
    ] = None,
    image_map: Annotated[
        list[str] | None,
        typer.Option(
            "--image-map",
            help="NAME=LOCAL: run tasks that name image NAME in local image LOCAL "
            "(repeatable; v1 tasks that need a container).",
            show_default=False,
        ),
    ] = None,
    temperature: TemperatureOption = None,
    max_tokens: MaxTokensOption = None,
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
    ] = DEFAULT_OUTPUT_ROOT,
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
    wait_for_tracking: Annotated[
        bool,
        typer.Option(
            "--wait-for-tracking",
            hidden=True,  # the default now: kept so that scripts passing it still run
            help="Exit only once the run is in MLflow (always so).",
        ),
    ] = True,
    request_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds one model request may take, wall-clock, from sending it to the "
            "last byte of its response (reasoning models can take minutes). Retries after "
            "a timeout: at most "
            f"{_MODEL_DEFAULTS.max_timeout_retries} (a hung endpoint fails a request after "
            f"about {_MODEL_DEFAULTS.max_timeout_retries + 1}x this); the rollout is then "
            "recorded as an error, never scored.",
        ),
    ] = _MODEL_DEFAULTS.request_timeout_s,
    max_retries: Annotated[
        int,
        typer.Option(
            help="Retries per request on 5xx, timeouts and connection errors (backoff with "
            f"jitter; at most {_MODEL_DEFAULTS.max_timeout_retries} after a timeout, see "
            "--request-timeout); 429s that say how long to wait are limited by "
            "--max-retry-wait instead.",
        ),
    ] = _MODEL_DEFAULTS.max_retries,
    max_retry_wait: Annotated[
        float,
        typer.Option(
            help="Seconds one request may spend waiting on rate limits (429 with Retry-After) "
            "before it fails; 0: fail on the first.",
        ),
    ] = _MODEL_DEFAULTS.max_retry_wait_s,
    check_model: Annotated[
        bool,
        typer.Option(
            help="Check the model name against the endpoint's model list (GET /models) first.",
        ),
    ] = _MODEL_DEFAULTS.check_model,
    pass_threshold: Annotated[
        float, typer.Option(help="A rollout passes (for pass@k) when reward >= this.")
    ] = _DEFAULTS.pass_threshold,
    max_error_rate: Annotated[
        float,
        typer.Option(
            help="Share of errored rollouts (0 to 1) a completed run may hold and still exit 0; "
            "above it (or when every rollout errored) the run exits 3.",
        ),
    ] = DEFAULT_MAX_ERROR_RATE,
    max_tool_error_rate: Annotated[
        float,
        typer.Option(
            help="Share of failed tool calls (0 to 1) a completed run may hold and still exit "
            "0; above it the run exits 3 (by default 1: any share; the summary warns when "
            "most tool calls failed).",
        ),
    ] = DEFAULT_MAX_TOOL_ERROR_RATE,
    adaptive_concurrency: Annotated[
        bool,
        typer.Option(
            help="Back off when the endpoint answers 429 (AIMD on requests in flight) and probe "
            "up again, so its limit need not be known; an explicit budget wins.",
        ),
    ] = _MODEL_DEFAULTS.adaptive_concurrency,
    max_cost: Annotated[
        float | None,
        typer.Option(
            help="Spend at most this many USD on the run (needs endpoint prices): each request "
            "reserves its worst case first; the run stops with status budget_exhausted (exit 5) "
            "and --resume with a higher cap, or none, finishes it.",
            show_default=False,
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Run N examples x R rollouts and save every trace as it completes.

    Exit status: 0 completed; 1 failed (finish it with --resume); 2 bad input;
    3 completed with errors above --max-error-rate (or failed tool calls above
    --max-tool-error-rate); 4 another process is working on
    the run; 5 stopped by --max-cost; 130 interrupted (SIGINT), 143 interrupted
    (SIGTERM): all resumable with --resume.
    """
    if not 0.0 <= max_error_rate <= 1.0:  # also rejects NaN
        raise VfopsError(
            f"--max-error-rate must be between 0 and 1 (a share of rollouts), not {max_error_rate}"
        )
    if not 0.0 <= max_tool_error_rate <= 1.0:
        raise VfopsError(
            "--max-tool-error-rate must be between 0 and 1 (a share of tool calls), "
            f"not {max_tool_error_rate}"
        )
    sampling = sampling_from_flags(sampling_args, temperature, max_tokens)
    request = EvalRequest(
        env_name=env,
        model=model,
        num_examples=num_examples,
        rollouts_per_example=rollouts_per_example,
        max_concurrent=max_concurrent,
        sampling_args=sampling,
        env_args=parse_json_object(env_args, "--env-args"),
        pass_threshold=pass_threshold,
        image_map=parse_image_map(image_map or []),
    )
    options = ModelOptions(
        base_url=base_url,
        api_key_var=api_key_var,
        endpoints_file=endpoints,
        request_timeout_s=request_timeout,
        max_retries=max_retries,
        max_retry_wait_s=max_retry_wait,
        check_model=check_model,
        adaptive_concurrency=adaptive_concurrency,
    )
    display = EvalDisplay(enabled=not quiet and sys.stderr.isatty())
    signals: list[int] = []
    try:
        with display:
            result = asyncio.run(
                _stopped_by_signals(
                    evaluate_async(
                        request,
                        RunOptions(
                            output_root=output,
                            resume=resume,
                            registry=registry,
                            tracking=tracking,
                            max_cost=max_cost,
                            sinks=tuple(sink or ()),
                            middleware=tuple(middleware or ()),
                        ),
                        model_options=options,
                        progress=display,
                    ),
                    signals,
                )
            )
    except (KeyboardInterrupt, asyncio.CancelledError):
        label = resume or "RUN"
        if display.run is not None:
            label = display.run.run_id or str(display.run.run_dir)
        print(
            f"interrupted: completed rollouts are kept; finish with: "
            f"vfops eval {env} -m {model} ... --resume {label}",
            file=sys.stderr,
        )
        # 128 + the signal's number, as a shell reports a process killed by it
        raise typer.Exit(128 + (signals[0] if signals else signal.SIGINT)) from None
    print_summary(result)
    problem = result.problem(max_error_rate, max_tool_error_rate)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        raise typer.Exit(result_exit_code(result, max_error_rate, max_tool_error_rate))


async def _stopped_by_signals(evaluation: Coroutine[Any, Any, T], signals: list[int]) -> T:
    """Run ``evaluation``; the first SIGINT or SIGTERM (what a Ctrl-C, ``timeout``,
    workers and orchestrators send) cancels it, so the run is recorded ``interrupted``
    with every row flushed; later ones only say that this is under way (a second Ctrl-C
    must not leave the run ``running`` with rows missing). Each is appended to
    ``signals``; the first is acknowledged on stderr at once. The handlers run on the
    event loop, which nothing blocks (reward functions that block run on threads)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def stop(signum: int) -> None:
        signals.append(signum)
        if len(signals) == 1:
            task.cancel()
            # said at once: the recording can take a moment, and a user (or a test
            # sending a second signal) knows this one was taken
            print(
                f"interrupted by {signal.Signals(signum).name}: stopping and recording "
                "what is done",
                file=sys.stderr,
                flush=True,
            )
        elif len(signals) == 2:
            print(
                "interrupted: recording the run's end (what is done is kept); it exits in a moment",
                file=sys.stderr,
                flush=True,
            )

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop, signum)
    try:
        return await evaluation
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
