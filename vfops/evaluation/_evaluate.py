"""One entry point for an evaluation: :func:`evaluate_async` (and :func:`evaluate`).

Every caller — ``vfops eval``, sweep and nightly cells, promotion gates, the
environments' own tests — runs an evaluation through it, so every run lands in
the same places with the same provenance:

1. the arguments are checked, the environment's name is looked up, the endpoint is
   checked, then the environment loads and its rows are counted (bad input, an
   unknown environment, an endpoint that does not answer or serve the model, an
   argument the environment refuses, a task it cannot run: one line, before anything
   is started or written);
2. only then the recorders start: the tracker (MLflow, in its own process, so its
   start-up overlaps the rollouts and a model loaded in-process) and the registry
   store; then an in-process model loads;
3. the run is opened: created, resumed (``resume=`` a run id, id prefix or run
   folder; or ``existing="resume"``: the newest unfinished run with the same
   configuration fingerprint) or reused (``existing="reuse"``: a completed run
   with that fingerprint; nothing is generated);
4. rollouts run with bounded concurrency; each scored group goes to the run
   folder first, then to the sinks (registry, Arrow export, MLflow, progress);
5. the sinks are closed and the run is finished: ``completed``, ``failed`` (a
   sink failed or the evaluation raised: the message names what and how to
   finish it) or ``interrupted`` (cancelled; the cancellation propagates).

This module is the sequence; each step is a module of its own: starting the
recorders (:mod:`._tracking_start`), what a run may spend and the client's
middleware (:mod:`._spending`), opening the run (:mod:`._open_run`), the rollout
loop (:mod:`._loop`) with its sinks (:mod:`._default_sinks`, :mod:`._sinks`), and
finishing it (:mod:`._finish`). Where and how a run is recorded is one object,
:class:`RunOptions`; the caller's own sinks are ``sinks=``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from vfops._errors import VfopsError
from vfops._image_map import image_map_scope
from vfops._paths import check_writable_folder
from vfops._redact import public_url
from vfops._settings import registry_retry_s, scoring_timeout_s
from vfops._twins import blocking_twin
from vfops.evaluation._loop import RunContext, run
from vfops.evaluation._model import ModelOptions, connect_model, is_in_process
from vfops.evaluation._open_run import (
    open_in_background,
    open_run,
    registry_summary,
    reused_result,
)
from vfops.evaluation._plugins import (
    check_middleware_names,
    check_sink_names,
    plugin_middleware,
)
from vfops.evaluation._result import (
    DEFAULT_OUTPUT_ROOT,
    EvalProgress,
    EvalResult,
    RunOptions,
)
from vfops.evaluation._runner import EvalRequest
from vfops.evaluation._spending import check_caps, check_priced, client_middleware, open_ledger
from vfops.evaluation._store import read_metadata
from vfops.evaluation._tracking_start import (
    check_tracking_server,
    run_store,
    start_tracker,
    tracking_on,
)
from vfops.rubrics import ScoringWorkers, start_scoring_workers

if TYPE_CHECKING:
    from vfops.clients import ModelClient
    from vfops.envs import Environment
    from vfops.evaluation._sinks import Sink
    from vfops.registry import RunStore
    from vfops.tracking import Tracker

__all__ = ["evaluate", "evaluate_async", "registry_summary"]


async def evaluate_async(
    request: EvalRequest,
    options: RunOptions | None = None,
    *,
    model_options: ModelOptions | None = None,
    environment: Environment | None = None,
    client: ModelClient | None = None,
    progress: EvalProgress | None = None,
    sinks: Sequence[Sink] = (),
) -> EvalResult:
    """Run (or resume, or reuse) an evaluation; see the module docstring.

    ``options`` (:class:`RunOptions`) say where and how the run is recorded and what it
    may spend. ``max_cost`` caps the run's spend in USD (its own ledger scope
    ``run:<id>``, so a resume with a higher cap continues it); ``cost_caps`` are
    further scopes the run spends against, shared with other runs (a sweep's
    ``sweep:<name>``: ``None`` records the spend without a cap). Each priced request
    reserves its worst-case cost on every scope first; a run that finds no room stops
    with status ``budget_exhausted`` (needs the registry and a priced endpoint).

    ``tracking`` (default: on unless ``VFOPS_TRACKING=0``) needs the registry: the
    MLflow run is recorded while the rollouts run, and this returns once MLflow has
    everything (metrics, rollouts, traces) and the registry run links it.
    ``environment`` and ``client`` replace the loaded environment and the client
    built from ``request.model`` (the caller keeps and closes them; the run then
    records ``request.model`` and ``model_options.base_url`` as given). ``sinks``
    (:class:`~vfops.evaluation.Sink`) get every scored group after the run's own
    sinks, and are closed with them before the run's end is recorded.
    """
    request = dataclasses.replace(request, tags=list(request.tags))
    opts = options or RunOptions()
    model_opts = model_options or ModelOptions()
    _check_input(request, opts, model_opts)
    track = opts.registry and tracking_on(opts.tracking)
    env = environment
    tracker: Tracker | None = None
    connection_client: ModelClient | None = None
    store: RunStore | None = None
    workers: ScoringWorkers | None = None
    try:
        # the cheap checks first: an unknown environment (its name looked up, nothing
        # imported), then an endpoint (reachable, serving the model): a wrong name, -b or
        # -m answers in a fraction of a second, where loading an environment costs
        # seconds (importing verifiers 0.4 alone ~2.2 s of CPU here)
        if env is None:
            from vfops.envs import require_environment

            require_environment(request.env_name)
        if client is not None:
            base_url = request.base_url or model_opts.base_url
            request.base_url = base_url and public_url(base_url)  # recorded: no credentials
        elif not is_in_process(request.model):
            client = connection_client = await _connect(request, model_opts)
        if env is None:
            from vfops.envs import load_environment

            with image_map_scope(request.image_map):  # what a taskset's tasks run in
                env = load_environment(request.env_name, **request.env_args)  # copied there
        # recorded as what runs: -1 (all) and an N above the dataset's size are its size
        # (its rows loaded here: a task's container image is mapped and checked)
        with image_map_scope(request.image_map):
            request.num_examples = _examples_to_run(env, request)
        # forked once the input and the endpoint are checked (a refusal starts nothing)
        # and before the tracker and registry start threads: sync reward functions run
        # there, with a memory limit, and what they start ends with them. The zygote
        # drops the rows built so far: scoring needs the rubric only
        workers = start_scoring_workers(release=env.drop_built_rows)
        if opts.capped:
            check_priced(client, request.model)  # None: in-process, refused before it loads
        if track:
            await asyncio.to_thread(check_tracking_server)
        # Nothing that records the run starts before the arguments, the environment, its
        # rows and the endpoint are checked: a refusal starts no tracker, registry or
        # model, and writes nothing. The tracker's start-up (MLflow) overlaps an
        # in-process model's loading and the rollouts.
        if track:
            tracker = start_tracker(request.env_name, serve_registry=opts.engine is None)
        if opts.registry:
            store = await run_store(opts.engine, tracker)
        if client is None:
            client = connection_client = await _connect(request, model_opts)
        return await _open_and_run(request, opts, env, client, store, tracker, progress, sinks)
    finally:
        if workers is not None:
            await workers.aclose()
        if connection_client is not None:
            await connection_client.aclose()
        if environment is None and env is not None:
            await env.aclose()
        # the store first: served by the tracker process (vfops eval), they end before
        # it can exit
        if store is not None:
            await store.aclose()
        if tracker is not None:
            await tracker.aclose()


async def _connect(request: EvalRequest, options: ModelOptions) -> ModelClient:
    """The client of ``request.model``; the request records the name and URL it resolved to."""
    connection = await connect_model(request.model, options)
    request.model, request.base_url = connection.model, connection.base_url
    return connection.client


def _check_input(request: EvalRequest, options: RunOptions, model_options: ModelOptions) -> None:
    """Bad input fails here, in one line, before anything starts or a run is recorded."""
    request.validate()
    check_caps(options.max_cost, options.cost_caps, registry=options.registry)
    model_options.validate()
    scoring_timeout_s()  # a bad VFOPS_SCORING_TIMEOUT_S is one line, before any run
    if options.registry:
        registry_retry_s()  # a bad VFOPS_REGISTRY_RETRY_S is one line, before any run
    if options.resume is None:  # a new run's folder goes there: checked before it is recorded
        fix = "pass a folder with -o/--output"
        root = options.output_root or DEFAULT_OUTPUT_ROOT
        check_writable_folder(root, what="output folder", fix=fix)
    if options.resume is not None and not options.registry:
        read_metadata(Path(options.resume))  # a clear one-line error on a wrong folder, now
    check_sink_names(options.sinks)
    check_middleware_names(options.middleware)


async def _open_and_run(
    request: EvalRequest,
    options: RunOptions,
    env: Environment,
    client: ModelClient,
    store: RunStore | None,
    tracker: Tracker | None,
    progress: EvalProgress | None,
    sinks: Sequence[Sink],
) -> EvalResult:
    """Open the run (reusing one returns at once), set up the client's middleware, run it."""
    output_root = options.output_root or DEFAULT_OUTPUT_ROOT
    opening: asyncio.Task[RunStore] | None = None
    # A new run is opened in the registry while its first rollouts run (importing the
    # registry and opening the run would otherwise come first); resuming or reusing
    # needs the registry's answer before anything is generated.
    if store is not None and options.resume is None and options.existing == "new":
        plan, opening = open_in_background(request, store, output_root)
    else:
        plan = await open_run(request, store, output_root, options.resume, options.existing)
    if plan.action == "reused":
        assert store is not None and plan.run_id is not None
        return await reused_result(store, plan)
    ledger = None
    if options.capped:
        assert store is not None and plan.run_id is not None
        ledger = await open_ledger(store, plan.run_id, options.max_cost, options.cost_caps or {})
    context = RunContext(
        env,
        client,
        plan,
        planned=request.num_examples * request.rollouts_per_example,
        registry=None if opening is not None else store,
        opening=opening,
        tracker=tracker,
        mlflow_parent_run_id=options.mlflow_parent_run_id,
        progress=progress,
        extra_sinks=sinks,
        plugin_sinks=options.sinks,
    )
    async with client_middleware(client, store, ledger, plugin_middleware(options.middleware)):
        return await run(context)


def _examples_to_run(env: Environment, request: EvalRequest) -> int:
    # eval_size, not len(env.eval_dataset): plain rows stay plain (no datasets import).
    size = env.eval_size(request.num_examples)
    if size is None:
        raise VfopsError(f"environment '{request.env_name}' has no dataset to evaluate")
    if size == 0:
        raise VfopsError(
            f"environment '{request.env_name}' has an empty eval dataset; check --env-args"
        )
    return size if request.num_examples < 0 else min(request.num_examples, size)


evaluate = blocking_twin(evaluate_async)
"""Synchronous :func:`evaluate_async` (same arguments)."""
