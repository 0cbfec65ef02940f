"""The platform's loop on embedded defaults, start to finish: ``vfops demo`` / ``make demo``.

Everything runs on this machine with nothing to start by hand (no API key, no
GPU, no server): the registry is SQLite and the artifact store a folder under
``DIR/home``, MLflow its embedded SQLite store there, Prefect its ephemeral mode
with its home under ``DIR/prefect``. The stages, each one line of progress:

1. a tiny base model is built locally (random weights: it knows nothing);
2. the ``lucky_digit`` environment is published (wheel + content hash in the
   registry and the artifact store); its prompts ask for one of two digits, full
   reward needs the right digit and a stop, and a policy that ignores the prompt
   scores at most 0.6;
3. the base model is registered (version 1) and made ``champion``: the gate's
   evaluation of it on the held-out split is the baseline (a registry run with
   its MLflow run);
4. the ``nightly-eval`` flow runs on ``models:/NAME@champion`` as yesterday's night;
5. GRPO trains the base model on the CPU (per-step metrics in MLflow), the
   checkpoint is registered (version 2) and promoted through the evidence gate: the
   ``train-evaluate-promote`` flow, a run in the demo's Prefect home like the nights;
6. promoting version 1 again is refused, with the environment and delta named;
7. the ``nightly-eval`` flow runs tonight on the new champion and is compared
   with last night.

:func:`run_demo` returns a :class:`DemoSummary` read back from the registry and
MLflow (not from printed text); ``summary.render()`` is what ``vfops demo`` prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import importlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfops._errors import VfopsError
from vfops._quiet import quiet_settings

if TYPE_CHECKING:
    from vfops.models import LoopRequest, LoopResult, PromotionDecision
    from vfops.training import GRPOConfig

DEMO_MODEL = "vfops-demo-policy"
"""The registered model name the demo's base and trained checkpoints get."""
DEMO_ENV = "lucky_digit"
STAGES = 7

Say = Callable[[str], None]


@dataclass(frozen=True)
class DemoSettings:
    """How big the demo is (the defaults are ``make demo``'s)."""

    steps: int | None = None
    """GRPO steps (None: the training config's)."""
    eval_examples: int = 64
    """Held-out examples each evaluation runs (64: the whole held-out split)."""
    nightly: bool = True
    """Run the two nights (Prefect, ephemeral mode)."""
    verbose: bool = False
    """Keep the libraries' own output (Prefect's INFO log lines, progress bars):
    off, the demo prints its stages and its summary only."""


@dataclass(frozen=True)
class Night:
    date: str
    run_id: str
    model: str
    reward: float
    previous_run_id: str | None
    verdict: str | None
    delta: float | None


@dataclass
class DemoSummary:
    """What the demo did, read back from the registry and MLflow."""

    workdir: Path
    environment: str
    """``name@version`` as published."""
    baseline_reward: float
    trained_reward: float
    training_run: str | None
    """The MLflow run of the training (per-step metrics)."""
    decisions: list[PromotionDecision] = field(default_factory=list)
    nights: list[Night] = field(default_factory=list)
    champion_version: str | None = None
    wall_s: float = 0.0
    max_tokens: int = 0
    """The token cap of every held-out reply (the training config's)."""
    baseline_truncated: float = 0.0
    """Share of the base model's held-out replies that ran into ``max_tokens``."""
    trained_truncated: float = 0.0
    transcript: str = ""
    """One of the trained model's held-out rollouts, as ``vfops runs show`` prints it."""

    def render(self) -> str:
        home = self.workdir / "home"
        lines = [
            "",
            f"vfops demo: the whole loop in {self.wall_s:.0f} s ({self.environment}, "
            f"model {DEMO_MODEL})",
            f"  held-out reward: {self.baseline_reward:.3f} (base model) -> "
            f"{self.trained_reward:.3f} (trained); replies cut off at {self.max_tokens} "
            f"tokens: {self.baseline_truncated:.0%} -> {self.trained_truncated:.0%}",
            f"  champion: version {self.champion_version}",
            "  promotions:",
        ]
        for decision in self.decisions:
            lines.append(
                f"    v{decision.to_version} -> @{decision.alias}: {decision.outcome}: "
                f"{decision.reason}"
            )
            for env in decision.envs:
                lines.append(
                    f"      {env.env}: candidate run {env.candidate_run_id}"
                    + (f", holder run {env.holder_run_id}" if env.holder_run_id else "")
                )
        if self.nights:
            lines.append(f"  nightly (models:/{DEMO_MODEL}@champion):")
        for night in self.nights:
            compared = (
                f"{night.verdict} ({night.delta:+.3f} vs run {night.previous_run_id})"
                if night.previous_run_id and night.delta is not None
                else "first night: the baseline"
            )
            lines.append(
                f"    {night.date}: run {night.run_id}, {night.model}, reward "
                f"{night.reward:.3f}, {compared}"
            )
        lines.append(f"  training: MLflow run {self.training_run or '-'}")
        if self.transcript:
            lines.append("  a held-out answer of the trained model:")
            lines += ["    " + line for line in self.transcript.splitlines()]
        lines += [
            "",
            "Browse it (in a new shell too):",
            *_activate_line(),
            f"  export VFOPS_HOME={home}",
            "  vfops runs list                      # every run, its status and reward",
            "  vfops runs show RUN                  # a run's rollouts and its MLflow run",
            f"  mlflow ui --backend-store-uri sqlite:///{home}/mlflow/mlflow.db "
            f"--default-artifact-root {home}/mlflow/artifacts",
            f"  PREFECT_HOME={self.workdir / 'prefect'} prefect server start   "
            "# the nightly flow runs",
        ]
        return "\n".join(lines)


def _activate_line() -> list[str]:
    """The command that puts this virtualenv's ``vfops``, ``mlflow`` and ``prefect`` on a
    new shell's PATH (``make demo`` runs them from ``.venv`` without activating it); none
    outside a virtualenv (a ``pip install vfops`` on the PATH already)."""
    if sys.prefix == sys.base_prefix:
        return []
    activate = Path(sys.prefix) / "bin" / "activate"
    with contextlib.suppress(ValueError):
        activate = activate.relative_to(Path.cwd())
    return [f"  source {activate}"]


@contextmanager
def demo_home(workdir: Path, *, verbose: bool = False) -> Iterator[None]:
    """Point the registry, the artifact store, MLflow and Prefect at ``workdir`` for
    the block: the demo never touches a user's own registry or tracking server.
    Not ``verbose``: the libraries' INFO lines and progress bars are left out (a user's
    own settings of them win)."""
    home = workdir / "home"
    site = private_site(workdir)
    values = {
        "VFOPS_HOME": str(home),
        # what the demo installs (the environment it publishes) goes in its own folder,
        # never the user's environment: first on the path here and in every child
        "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p),
        "PREFECT_HOME": str(workdir / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "VFOPS_TRACKING": "1",
        # one progress line per stage: not MLflow's download bars
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        # the demo trains on the CPU: say so, rather than DeepSpeed warning it found no GPU
        "DS_ACCELERATOR": "cpu",
    }
    # Prefect's ephemeral server gets 20 s to answer by default, too little for a
    # 2-core machine that is also training; a user's own setting wins.
    startup = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
    values[startup] = os.environ.get(startup) or "120"
    values.update(quiet_settings(verbose))
    cleared = ("VFOPS_DATABASE_URL", "VFOPS_ARTIFACTS", "MLFLOW_TRACKING_URI", "PREFECT_API_URL")
    saved = {name: os.environ.get(name) for name in (*values, *cleared)}
    os.environ.update(values)
    for name in cleared:
        os.environ.pop(name, None)
    sys.path.insert(0, str(site))
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(site))
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def private_site(workdir: Path) -> Path:
    """The folder the demo installs packages into (on ``sys.path`` in :func:`demo_home`)."""
    return workdir / "site-packages"


def run_demo(workdir: Path, settings: DemoSettings | None = None, say: Say = print) -> DemoSummary:
    """Run the loop in ``workdir`` (created; a second run starts over in a fresh one)."""
    settings = settings or DemoSettings()
    workdir = workdir.expanduser().resolve()
    if (workdir / "home").exists():
        raise VfopsError(
            f"{workdir} holds an earlier demo; remove it (rm -r {workdir}) or pass another --dir"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with demo_home(workdir, verbose=settings.verbose):
        summary = _run(workdir, settings, say)
    summary.wall_s = time.perf_counter() - started
    return summary


def _run(workdir: Path, settings: DemoSettings, say: Say) -> DemoSummary:
    from vfops.demo._assets import demo_train_config
    from vfops.local import build_tiny_model
    from vfops.models import (
        LoopRequest,
        PromotionRequest,
        promote,
        register_checkpoint,
        train_evaluate_promote,
    )

    say(f"[1/{STAGES}] building a tiny base model (random weights) in {workdir / 'base-model'}")
    base = build_tiny_model(workdir / "base-model", seed=0)

    say(f"[2/{STAGES}] publishing the {DEMO_ENV} environment (registry + artifact store)")
    environment = publish_demo_environment(workdir)

    config = demo_train_config(workdir)
    # every held-out figure (the gate's, the trainer's, the nights') is one measurement:
    # the same split, decoded as the trainer's own held-out eval decodes it
    held_out = held_out_sampling(config)
    say(f"[3/{STAGES}] registering the base model and evaluating it on the held-out split")
    register_checkpoint(base, name=DEMO_MODEL, base_model="tiny-llama", description="base")
    # the base model (v1) through the gate: made champion now, refused it back at stage 6
    base_request = PromotionRequest(
        DEMO_MODEL,
        "1",
        gate_envs=[DEMO_ENV],
        num_examples=settings.eval_examples,
        sampling_args=held_out,
    )
    gate_base = functools.partial(promote, base_request)
    first = gate_base()
    baseline = first.envs[0].candidate_mean
    say(f"        base model: held-out reward {baseline:.3f}; {first.reason}")

    nights: list[Night] = []
    today = dt.datetime.now(dt.UTC).date()
    if settings.nightly:
        say(f"[4/{STAGES}] nightly-eval (Prefect) on models:/{DEMO_MODEL}@champion, last night")
        nights.append(_night(today - dt.timedelta(days=1), settings, held_out))
    else:
        say(f"[4/{STAGES}] nightly-eval skipped")

    loop_request = LoopRequest(
        config,
        register_as=DEMO_MODEL,
        gate_envs=[DEMO_ENV],
        steps=settings.steps,
        gate_examples=settings.eval_examples,
        gate_sampling_args=held_out,
    )
    if settings.nightly:  # Prefect runs: the loop is a flow run in DIR/prefect, beside the nights
        say(
            f"[5/{STAGES}] train-evaluate-promote (Prefect): GRPO on the CPU, then register "
            "the checkpoint and promote it on evidence"
        )
        loop = _loop_flow_run(workdir, config, loop_request)
        trained = loop.training
        say(
            f"        {trained.steps} steps: held-out reward {trained.baseline_eval_reward:.3f}"
            f" -> {trained.final_eval_reward:.3f} (per-step metrics: MLflow run "
            f"{trained.mlflow_run_id})"
        )
    else:
        say(
            f"[5/{STAGES}] GRPO on the CPU, then register the checkpoint and promote it on evidence"
        )
        loop = train_evaluate_promote(
            loop_request, progress=_training_progress(say, settings.steps or config.run.steps)
        )
    say(f"        v{loop.version}: {loop.decision.outcome}: {loop.decision.reason}")

    say(f"[6/{STAGES}] asking the gate to give champion back to the base model (v1)")
    refused = gate_base()
    say(f"        v1: {refused.outcome}: {refused.reason}")

    if settings.nightly:
        say(f"[7/{STAGES}] nightly-eval tonight on the new champion, compared with last night")
        nights.append(_night(today, settings, held_out))
    else:
        say(f"[7/{STAGES}] nightly-eval skipped")
    (gate,) = (env for env in loop.decision.envs if env.env == DEMO_ENV)
    return DemoSummary(
        workdir=workdir,
        environment=environment,
        baseline_reward=baseline,
        trained_reward=gate.candidate_mean,
        training_run=loop.training.mlflow_run_id,
        decisions=[first, loop.decision, refused],
        nights=nights,
        champion_version=_champion_version(),
        max_tokens=int(held_out["max_tokens"]),
        baseline_truncated=_truncated_share(first.envs[0].candidate_run_id),
        trained_truncated=_truncated_share(gate.candidate_run_id),
        transcript=_first_transcript(gate.candidate_run_id),
    )


def held_out_sampling(config: GRPOConfig) -> dict[str, Any]:
    """How the training config's held-out eval decodes (its temperature, its token cap)."""
    return {"temperature": config.run.eval_temperature, "max_tokens": config.generation.max_tokens}


def _truncated_share(run_id: str) -> float:
    summary = _registry_run(run_id).summary
    return float(summary.get("truncated") or 0) / max(int(summary.get("rollouts") or 0), 1)


def _first_transcript(run_id: str) -> str:
    """The run's first rollout (example 0), as ``vfops runs show`` prints it."""
    from vfops.evaluation import format_transcript
    from vfops.registry import get_engine, rollouts_for_example, session_scope

    with session_scope(get_engine(), write=False) as session:
        records = rollouts_for_example(session, run_id, 0)
    return format_transcript(records[0], width=76) if records else ""


def publish_demo_environment(workdir: Path) -> str:
    """Publish the demo's environment and make it loadable; its ``name@version``.

    Inside :func:`demo_home` only. Published from a copy (building writes into the
    project folder, which may sit in a read-only site-packages). A checkout has it
    installed (editable); elsewhere the published wheel goes into the demo's own
    :func:`private_site`, never into the user's environment.
    """
    from vfops.demo._assets import environment_project
    from vfops.envs import installed_environments
    from vfops.publishing import install_published, publish_environment

    project = workdir / DEMO_ENV
    shutil.copytree(
        environment_project(), project, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    published = publish_environment(project)
    ref = f"{published.env_name}@{published.version}"
    if published.env_name not in installed_environments():
        # vfops, its one dependency, is installed already: the target holds the env only
        install_published(ref, target=private_site(workdir), no_deps=True)
        importlib.invalidate_caches()
    return ref


def _training_progress(say: Say, steps: int) -> Callable[[str, int, dict[str, float]], None]:
    every = max(1, steps // 10)

    def progress(kind: str, step: int, metrics: dict[str, float]) -> None:
        if kind == "eval":
            say(f"        step {step}/{steps}: held-out reward {metrics['eval_reward']:.3f}")
        elif step % every == 0:
            say(
                f"        step {step}/{steps}: reward {metrics['reward_mean']:.3f}, "
                f"cut off at max_tokens {metrics['truncated_fraction']:.0%}"
            )

    return progress


def _night(day: dt.date, settings: DemoSettings, sampling: dict[str, Any]) -> Night:
    from vfops.nightly import NightlyConfig
    from vfops.orchestration import load_flow
    from vfops.sweeps import SamplingConfig

    # the flow itself, by its entry point (vfops.flows sits above the demo's layer)
    nightly_eval = load_flow("nightly-eval")

    config = NightlyConfig(
        environments=[DEMO_ENV],
        endpoints=[f"models:/{DEMO_MODEL}@champion"],
        num_examples=settings.eval_examples,
        rollouts_per_example=1,
        sampling=[SamplingConfig(name="held-out", args=sampling)],
        date=day.isoformat(),
    )
    results: list[dict[str, Any]] = asyncio.run(nightly_eval(config))
    (result,) = results
    report = result.get("report") or {}
    run = _registry_run(str(result["run_id"]))
    return Night(
        date=day.isoformat(),
        run_id=run.id,
        model=run.model,
        reward=float(run.summary.get("reward_mean") or 0.0),
        previous_run_id=result.get("previous_run_id"),
        verdict=report.get("verdict"),
        delta=report.get("delta"),
    )


def _loop_flow_run(workdir: Path, config: GRPOConfig, request: LoopRequest) -> LoopResult:
    """Stage 5 as the ``train-evaluate-promote`` flow runs it, so the demo's Prefect home
    holds that run (and its report) beside the two nights. The flow reads its training
    config from a TOML file: the demo's config is written to ``DIR/train.toml``."""
    from vfops.models import EnvGateResult, LoopResult, PromotionDecision
    from vfops.orchestration import load_flow
    from vfops.training import TrainResult

    path = workdir / "train.toml"
    path.write_text(_toml_tables(config.model_dump(mode="json", exclude_none=True)))
    flow = load_flow("train-evaluate-promote")  # by its entry point, as the nights' flow
    done: dict[str, Any] = asyncio.run(
        flow(
            config_path=str(path),
            register_as=request.register_as,
            gate_envs=list(request.gate_envs),
            steps=request.steps,
            gate_examples=request.gate_examples,
            gate_sampling_args=dict(request.gate_sampling_args or {}),
        )
    )
    decision = {**done["decision"]}
    decision["envs"] = [EnvGateResult(**env) for env in decision["envs"]]
    name, version = str(done["model_uri"]).removeprefix("models:/").rsplit("/", 1)
    return LoopResult(
        TrainResult.from_json(done["training"]), name, version, PromotionDecision(**decision)
    )


def _toml_tables(data: dict[str, dict[str, Any]]) -> str:
    """TOML of a config's tables (values: str, bool, int, float, lists and inline tables)."""
    lines: list[str] = []
    for table, fields in data.items():
        lines += [f"[{table}]", *(f"{key} = {_toml_value(value)}" for key, value in fields.items())]
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        items = (f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + ", ".join(items) + " }"
    raise VfopsError(f"cannot write {value!r} to a TOML config")


def _registry_run(run_id: str) -> Any:
    from vfops.registry import get_engine, get_run, session_scope

    with session_scope(get_engine(), write=False) as session:
        run = get_run(session, run_id)
        if run is None:
            raise VfopsError(f"nightly run {run_id} is not in the registry")
        session.expunge(run)
        return run


def _champion_version() -> str | None:
    from vfops.tracking import mlflow_client

    try:
        return str(mlflow_client().get_model_version_by_alias(DEMO_MODEL, "champion").version)
    except Exception:  # no champion: the summary says so
        return None
