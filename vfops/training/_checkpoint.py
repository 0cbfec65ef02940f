"""Checkpointing: save and resume a run exactly, export the model, register it.

Heavy module (torch, accelerate), imported lazily by the recipe. A checkpoint
folder holds:

- ``accelerate/``: accelerate's own state (model, optimizer, LR schedule, RNGs);
- ``model/``: an exported Hugging Face model folder (LoRA merged), what ``vfops eval``,
  ``vfops vllm serve`` and registration read;
- ``trainer_state.json``: the step (= the data position: data order is a pure
  function of the step), the config, and what the run's tags recorded;
- ``pending_batches_rank<i>.pt``: the batches generated ahead (``async_steps > 0``),
  whose weights are gone once the step moves on (the generation scheduler writes them);
- ``manifest.json``: every other file's size and sha256, written last.

A checkpoint is written beside its place and renamed in once sealed
(:mod:`vfops.training._manifest`), so a crash leaves the old whole checkpoint or the
new one, never a mix; a resume verifies the manifest first.

Registration itself lives in :mod:`vfops.checkpoints` (``register_checkpoint``).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vfops.training import _manifest
from vfops.training._config import GRPOConfig
from vfops.training._setup import Policy

STATE_FILE = _manifest.STATE_FILE
PENDING_PREFIX = "pending_batches_rank"
MODEL_SUBDIR = "model"
ACCELERATE_SUBDIR = "accelerate"


@dataclass(frozen=True, slots=True)
class TrainerState:
    """What ``trainer_state.json`` records besides accelerate's state."""

    step: int
    config: GRPOConfig
    base_model: str
    environment_versions: dict[str, str] = field(default_factory=dict)
    mlflow_run_id: str | None = None

    def to_json(self) -> str:
        state = {
            "step": self.step,
            "data_position": self.step,  # batch index == step: data order is a pure function
            "config": self.config.model_dump(),
            "base_model": self.base_model,
            "environment_versions": self.environment_versions,
            "mlflow_run_id": self.mlflow_run_id,
        }
        return json.dumps(state, indent=2) + "\n"


class Checkpointer:
    """Saves and restores ``policy`` (every rank calls both; rank 0 writes the shared files)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def pending_file(self, directory: Path) -> Path:
        """This rank's file of batches generated ahead in ``directory``."""
        return directory / f"{PENDING_PREFIX}{self.policy.accelerator.process_index}.pt"

    def save(
        self, directory: str | Path, state: TrainerState, ahead: Callable[[Path], None]
    ) -> Path:
        """Write a resumable checkpoint at ``directory``; ``ahead(path)`` writes this
        rank's batches generated ahead to ``path``. Returns the folder.

        Everything is written to a staging folder beside ``directory``, sealed with a
        manifest and renamed into place by the main process (a checkpoint already there
        is replaced whole): ``directory`` never holds a half-written checkpoint.
        """
        accelerator = self.policy.accelerator
        target = Path(directory)
        if accelerator.is_main_process:
            _manifest.begin(target)
        accelerator.wait_for_everyone()
        staging = _manifest.staging_path(target)
        with _tied_weights_not_reported():
            accelerator.save_state(str(staging / ACCELERATE_SUBDIR))
        if accelerator.is_main_process:
            _manifest.kill_point("staging")
            self.export_model(staging / MODEL_SUBDIR)
            (staging / STATE_FILE).write_text(state.to_json())
        ahead(self.pending_file(staging))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            _manifest.seal(staging)
            _manifest.publish(staging, target)
        accelerator.wait_for_everyone()
        return target

    def load(self, directory: Path) -> None:
        """Restore accelerate's state (weights, optimizer, schedule, RNGs) from a checkpoint
        :meth:`save` wrote (check it first with :func:`read_step`)."""
        self.policy.accelerator.load_state(str(directory / ACCELERATE_SUBDIR))

    def export_model(self, path: Path) -> None:
        """A Hugging Face model folder at ``path`` (LoRA adapters merged into a copy)."""
        model = self.policy.accelerator.unwrap_model(self.policy.model)
        if hasattr(model, "merge_and_unload"):
            model = merged_model(model)
        from vfops.local import quiet_progress

        with quiet_progress():
            model.save_pretrained(str(path), safe_serialization=True)
        self.policy.tokenizer.save_pretrained(str(path))


def merged_model(peft_model: Any) -> Any:
    """A plain transformers model holding ``peft_model``'s weights with its LoRA adapters
    merged, named as the base model names them (what a model folder must hold: the
    adapter-wrapped base model would save ``q_proj.base_layer.weight`` and
    ``lora_A`` keys that a plain load ignores, leaving those layers random). Built on
    the meta device and filled from the merged weights, every key checked (strict)."""
    import torch
    import transformers

    from vfops.training._weights import full_state_dict

    base = peft_model.get_base_model()
    weights = full_state_dict(peft_model)
    with torch.device("meta"):
        plain = transformers.AutoModelForCausalLM.from_config(base.config)  # type: ignore[no-untyped-call]
    plain.load_state_dict(weights, strict=True, assign=True)
    plain.tie_weights()  # one tensor again where the config ties them (assign copied both)
    plain.generation_config = base.generation_config
    plain.eval()
    return plain


def read_step(src: Path) -> int:
    """The step a checkpoint folder was saved at, once an interrupted publish to it is
    finished and its manifest verified; a one-line
    :class:`~vfops.training._manifest.CheckpointError` when it is not whole."""
    _manifest.open_checkpoint(src)
    state: dict[str, Any] = json.loads((src / STATE_FILE).read_text())
    return int(state["step"])


def read_mlflow_run_id(src: Path) -> str | None:
    """The MLflow run a checkpoint folder (checked by :func:`read_step`) was trained in;
    None when it was trained without tracking."""
    state: dict[str, Any] = json.loads((src / STATE_FILE).read_text())
    run_id = state.get("mlflow_run_id")
    return str(run_id) if run_id else None


def register(model_dir: Path, name: str, state: TrainerState) -> str:
    """Register an exported model folder in MLflow; returns ``models:/name/version``."""
    from vfops.checkpoints import register_checkpoint

    info = register_checkpoint(
        model_dir,
        name=name,
        training_run_id=state.mlflow_run_id,
        base_model=state.base_model,
        environment_versions=state.environment_versions,
        description=f"GRPO step {state.step} on {state.config.environment.id}",
    )
    return info.uri


class _DropTiedWeightsNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # accelerate's adapter prefixes "[RANK n] "
        return "Removed shared tensor" not in str(record.msg)


@contextlib.contextmanager
def _tied_weights_not_reported() -> Iterator[None]:
    """Silence accelerate's "Removed shared tensor ... while saving" during a checkpoint.

    A model with tied input and output embeddings stores the tensor once (safetensors
    cannot hold two views of one storage) and ``load_state`` ties them again: the notice
    says nothing a user can act on, on every checkpoint. ``test_resume_is_exact`` checks
    that the reload is exact.
    """
    notice = _DropTiedWeightsNotice()
    accelerate_logger = logging.getLogger("accelerate.utils.other")
    accelerate_logger.addFilter(notice)
    try:
        yield
    finally:
        accelerate_logger.removeFilter(notice)
