"""The one training entry point: :func:`train` (and :func:`train_async`).

``vfops train CONFIG.toml`` and the ``train-grpo`` Prefect flow are thin layers
over it. The run sequence: resolve the config (overrides applied in one place,
:func:`resolve_config`) and validate it, check the attention kernels ``[model]
attn_implementation`` asks for and the ``[train]`` extra, then
either train in this process or, for several processes or DeepSpeed, launch
:mod:`vfops.training._launched` under ``accelerate launch``; the recipe trains,
evaluates, saves and registers the final checkpoint in MLflow when asked
(``[run] register_as``); a typed :class:`TrainResult` comes back.

A launched run talks to this process through files in a temporary folder, never
through its output: the request (config, resume folder) goes in
``request.json``; the main rank appends one JSON line per progress event to
``progress.jsonl`` (relayed to ``progress`` here as they come) and writes
``result.json`` at the end; a rank that fails writes ``errors/rankN.json``. The
children's stdout goes to this process's stderr, so whatever they print
(libraries, user code) cannot be mistaken for the result.

Light module: torch loads only when training starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfops._errors import MissingExtraError, VfopsError
from vfops._net import free_port
from vfops.training._attention import check_attention
from vfops.training._config import GRPOConfig, load_config
from vfops.training._progress import Progress

if TYPE_CHECKING:
    from vfops.training._recipe import GRPORecipe

LAUNCHED_ENV = "VFOPS_TRAIN_LAUNCHED"
"""Set in launched training processes: :func:`train` there trains, it does not launch."""


_POLL_S = 0.2


class TrainingProcessError(VfopsError):
    """A launched training process failed or wrote no result."""

    exit_code = 1


@dataclass(frozen=True, slots=True)
class TrainResult:
    """What a training run produced (on the main process).

    ``registered``: ``models:/NAME/VERSION`` when the final checkpoint was
    registered in MLflow. ``history``: each step's metrics, in order.
    """

    steps: int
    baseline_eval_reward: float
    final_eval_reward: float
    checkpoint: Path
    processes: int = 1
    mlflow_run_id: str | None = None
    registered: str | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    heldout_paired: dict[str, float] | None = None
    """The final held-out eval against the baseline, example by example (``heldout_delta``,
    its 95% CI, the paired bootstrap's ``heldout_p_better``); the rows are in
    ``output_dir/heldout/``."""

    @property
    def registered_version(self) -> str | None:
        """The registered model version (``"3"``), or None."""
        return self.registered.rsplit("/", 1)[-1] if self.registered else None

    def summary(self) -> dict[str, Any]:
        """The run summary as JSON-ready values (everything but the history)."""
        return {
            "baseline_eval_reward": self.baseline_eval_reward,
            "final_eval_reward": self.final_eval_reward,
            "steps": self.steps,
            "processes": self.processes,
            "checkpoint": str(self.checkpoint),
            "registered": self.registered,
            "registered_version": self.registered_version,
            "mlflow_run_id": self.mlflow_run_id,
            "heldout_paired": self.heldout_paired,
        }

    def to_json(self) -> dict[str, Any]:
        return {**self.summary(), "history": self.history}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainResult:
        return cls(
            steps=int(data["steps"]),
            baseline_eval_reward=float(data["baseline_eval_reward"]),
            final_eval_reward=float(data["final_eval_reward"]),
            checkpoint=Path(data["checkpoint"]),
            processes=int(data["processes"]),
            mlflow_run_id=data.get("mlflow_run_id"),
            registered=data.get("registered"),
            history=list(data.get("history", [])),
            heldout_paired=data.get("heldout_paired"),
        )


# --------------------------------------------------------------------------- config


def resolve_config(
    config: GRPOConfig | str | Path,
    *,
    steps: int | None = None,
    output_dir: str | Path | None = None,
    deepspeed: str | Path | None = None,
    register_as: str | None = None,
    tracking: bool | None = None,
) -> GRPOConfig:
    """The validated config of a run: ``config`` (a TOML path, or a config, which is
    copied, not changed) with the given overrides of its ``[run]`` section."""
    cfg = load_config(config) if isinstance(config, str | Path) else config
    # The one place a run's overrides are applied: validated like the file's values.
    overrides: dict[str, Any] = {}
    if steps is not None:
        overrides["run.steps"] = steps
    if output_dir is not None:
        overrides["run.output_dir"] = str(Path(output_dir).expanduser().resolve())
    if deepspeed is not None:
        path = Path(deepspeed).expanduser()
        if not path.is_file():
            raise VfopsError(
                f"deepspeed config {str(deepspeed)!r} does not exist; pass a DeepSpeed JSON "
                "such as configs/deepspeed/zero2.json"
            )
        overrides["run.deepspeed"] = str(path.resolve())
    if register_as is not None:
        overrides["run.register_as"] = register_as
    if tracking is not None:
        overrides["run.tracking"] = tracking
    return cfg.with_overrides(overrides) if overrides else cfg.checked()


def check_resume(resume: str | Path | None) -> Path | None:
    """The checkpoint folder to resume from, checked to be a whole checkpoint (an
    interrupted save to it finished or undone, every file as its manifest lists it):
    one line naming an earlier checkpoint otherwise, before any model loads."""
    if resume is None:
        return None
    from vfops.training._manifest import open_checkpoint

    return open_checkpoint(Path(resume))


def preflight(cfg: GRPOConfig) -> None:
    """What a run needs besides a valid config, checked before torch loads or anything is
    built or written (``vfops train --check`` runs it too), on this machine: the attention
    kernels asked for, the DeepSpeed file, the model folder (or leave to build it), the
    environment installed and its ``[environment] args`` fitting its ``load_environment``
    signature."""
    check_attention(cfg)
    if cfg.run.deepspeed and not Path(cfg.run.deepspeed).expanduser().is_file():
        raise VfopsError(
            f"[run] deepspeed {cfg.run.deepspeed!r} does not exist; pass a DeepSpeed JSON "
            "such as configs/deepspeed/zero2.json, or '' for none"
        )
    model = Path(cfg.model.path).expanduser()
    if cfg.model.gguf and not model.is_dir():
        from vfops.local import find_gguf

        find_gguf(cfg.model.gguf)  # a source that is not there fails at the door
    elif not model.is_dir() and not cfg.model.build_tiny_if_missing:
        raise VfopsError(
            f"[model] path {str(model)!r} does not exist; build one with "
            "`vfops model build-tiny DIR`, import one with `vfops model import`, or set "
            "build_tiny_if_missing = true or gguf = FILE"
        )
    check_environment_args(cfg.environment.id, cfg.environment.args)


def check_environment_args(env_id: str, args: dict[str, Any]) -> None:
    """The environment ``env_id`` installed, and ``args`` fitting its ``load_environment``
    signature (its module is imported, nothing is called); one line otherwise."""
    import inspect

    from vfops.envs import load_failure, require_environment

    entry = require_environment(env_id)
    try:
        factory = entry.load()
    except Exception as exc:
        raise load_failure(
            f"environment '{entry.name}' failed to import:",
            exc,
            otherwise="fix the package or reinstall it with: vfops env install PATH",
        ) from exc
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # a module (verifiers v1 tasksets) or a builtin: its library checks on load
    try:
        signature.bind(**args)
    except TypeError as exc:
        accepted = ", ".join(
            ("**" if p.kind is p.VAR_KEYWORD else "") + name
            for name, p in signature.parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.VAR_KEYWORD)
        )
        raise VfopsError(
            f"[environment] args do not fit load_environment of '{env_id}': {exc}; it "
            f"accepts: {accepted or 'no arguments'}"
        ) from None


def require_train_extra() -> None:
    """Raise :class:`MissingExtraError` unless torch, transformers, accelerate, peft import."""
    for module in ("torch", "transformers", "accelerate", "peft"):
        try:
            __import__(module)
        except ImportError as exc:
            raise MissingExtraError("train", exc.name or module) from exc


# --------------------------------------------------------------------------- entry point


def train(
    config: GRPOConfig | str | Path,
    *,
    steps: int | None = None,
    output_dir: str | Path | None = None,
    resume: str | Path | None = None,
    num_processes: int = 1,
    deepspeed: str | Path | None = None,
    register_as: str | None = None,
    tracking: bool | None = None,
    progress: Progress | None = None,
) -> TrainResult:
    """Train with GRPO: the whole run, in this process or launched; see the module docstring.

    Args:
        config: A training config, or the path of its TOML file.
        steps, output_dir, deepspeed, register_as, tracking: Override ``[run]`` fields.
        resume: A checkpoint folder written by a run to continue from.
        num_processes: Training processes (devices); more than 1, or a DeepSpeed
            config, runs under ``accelerate launch``.
        progress: Called on the main process after every eval and step.
    """
    cfg = resolve_config(
        config,
        steps=steps,
        output_dir=output_dir,
        deepspeed=deepspeed,
        register_as=register_as,
        tracking=tracking,
    )
    checkpoint = check_resume(resume)
    if num_processes < 1:
        raise VfopsError(f"num_processes = {num_processes}; use 1 or more")
    # a missing flash-attn, model, environment or a bad environment argument: one line,
    # before torch loads or anything is built or written (a bad argument *value* still
    # shows once the environment loads)
    preflight(cfg)
    require_train_extra()
    if (num_processes > 1 or cfg.run.deepspeed) and not os.environ.get(LAUNCHED_ENV):
        return _launch(cfg, checkpoint, num_processes, progress)
    result, _ = run_recipe(cfg, checkpoint, progress)
    return result


async def train_async(
    config: GRPOConfig | str | Path,
    *,
    steps: int | None = None,
    output_dir: str | Path | None = None,
    resume: str | Path | None = None,
    num_processes: int = 1,
    deepspeed: str | Path | None = None,
    register_as: str | None = None,
    tracking: bool | None = None,
    progress: Progress | None = None,
) -> TrainResult:
    """:func:`train` in a worker thread (``progress`` is called from that thread)."""
    return await asyncio.to_thread(
        train,
        config,
        steps=steps,
        output_dir=output_dir,
        resume=resume,
        num_processes=num_processes,
        deepspeed=deepspeed,
        register_as=register_as,
        tracking=tracking,
        progress=progress,
    )


def run_recipe(
    cfg: GRPOConfig, resume: Path | None, progress: Progress | None
) -> tuple[TrainResult, bool]:
    """Train in this process (one rank of a launched run, or the only one); returns the
    result and whether this is the main process (the only one that reports progress)."""
    from vfops.training._recipe import GRPORecipe

    with GRPORecipe(cfg) as recipe:
        recipe.setup()
        if resume is not None:
            recipe.resume(resume)
        main = bool(recipe.accelerator.is_main_process)
        out = recipe.train(progress if main else None)
        run_id = _run_id(recipe)
    result = TrainResult(
        steps=int(out["steps"]),
        baseline_eval_reward=float(out["baseline_eval_reward"]),
        final_eval_reward=float(out["final_eval_reward"]),
        checkpoint=Path(out["checkpoint"]),
        processes=int(out["processes"]),
        mlflow_run_id=run_id,
        registered=out["registered"],
        history=list(out["history"]),
        heldout_paired=out.get("heldout_paired"),
    )
    return result, main


def _run_id(recipe: GRPORecipe) -> str | None:
    return recipe.tracker.run_id if recipe.tracker is not None else None


# --------------------------------------------------------------------------- launching


@dataclass(frozen=True, slots=True)
class LaunchFiles:
    """Where a launched run's request, progress, result and errors live."""

    folder: Path

    @property
    def request(self) -> Path:
        return self.folder / "request.json"

    @property
    def progress(self) -> Path:
        return self.folder / "progress.jsonl"

    @property
    def result(self) -> Path:
        return self.folder / "result.json"

    @property
    def errors(self) -> Path:
        return self.folder / "errors"


def _launch(
    cfg: GRPOConfig, resume: Path | None, num_processes: int, progress: Progress | None
) -> TrainResult:
    with tempfile.TemporaryDirectory(prefix="vfops-train-") as tmp:
        files = LaunchFiles(Path(tmp))
        files.errors.mkdir()
        files.request.write_text(
            json.dumps({"config": config_data(cfg), "resume": str(resume) if resume else None})
        )
        code = _run_child(
            _child_command(num_processes, files), _child_env(num_processes), files, progress
        )
        return _collect(files, code)


def config_data(cfg: GRPOConfig) -> dict[str, Any]:
    """The config as TOML-shaped data (``config_from_dict`` reads it back), whether the
    config classes are dataclasses or pydantic models."""
    dump = getattr(cfg, "model_dump", None)
    if callable(dump):
        data: dict[str, Any] = dump(mode="json")
        return data
    return dataclasses.asdict(cfg)


def _child_command(num_processes: int, files: LaunchFiles) -> list[str]:
    child = ["-m", "vfops.training._launched", str(files.folder)]
    if num_processes == 1:
        # DeepSpeed on a single device needs no launcher, only the torch.distributed
        # rendezvous variables (_child_env), which accelerate's simple launcher does
        # not set (DeepSpeed would then look for MPI).
        return [sys.executable, *child]
    return [
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
        *child,
    ]


def _child_env(num_processes: int) -> dict[str, str]:
    env = {**os.environ, LAUNCHED_ENV: "1"}
    if num_processes == 1:
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        env.setdefault("MASTER_PORT", str(free_port(address="127.0.0.1")))
    return env


def _run_child(
    cmd: list[str], env: dict[str, str], files: LaunchFiles, progress: Progress | None
) -> int:
    """Run the launch, relaying progress events as they are written; its exit code."""
    relay = _ProgressRelay(files.progress, progress)
    proc = subprocess.Popen(cmd, env=env, stdout=_stderr_fd())
    try:
        while proc.poll() is None:
            relay.pump()
            time.sleep(_POLL_S)
    except BaseException:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise
    relay.pump()
    return proc.returncode


def _stderr_fd() -> int | None:
    """This process's stderr: the children's stdout goes there (None: inherit stdout)."""
    try:
        return sys.__stderr__.fileno() if sys.__stderr__ is not None else None
    except (OSError, ValueError):
        return None


class _ProgressRelay:
    """Reads the complete JSON lines appended to the progress file since the last pump."""

    def __init__(self, path: Path, progress: Progress | None) -> None:
        self._path = path
        self._progress = progress
        self._offset = 0

    def pump(self) -> None:
        if self._progress is None or not self._path.is_file():
            return
        with self._path.open("rb") as file:
            file.seek(self._offset)
            data = file.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            event = json.loads(line)
            self._progress(str(event["kind"]), int(event["step"]), dict(event["metrics"]))


def _collect(files: LaunchFiles, code: int) -> TrainResult:
    """The launched run's result, or its first rank's error as one line."""
    if code == 0 and files.result.is_file():
        return TrainResult.from_json(json.loads(files.result.read_text()))
    errors = sorted(files.errors.glob("rank*.json"), key=lambda p: int(p.stem[4:] or 0))
    if errors:
        error = json.loads(errors[0].read_text())
        if error["user_error"]:
            user_error = VfopsError(error["message"])
            user_error.exit_code = int(error["exit_code"])
            raise user_error
        raise TrainingProcessError(
            f"training process rank {error['rank']} failed: {error['type']}: "
            f"{error['message']}; its traceback is above"
        )
    if code == 0:
        raise TrainingProcessError("the training processes exited without writing a result")
    raise TrainingProcessError(
        f"the training processes exited with code {code}; their output is above"
    )
