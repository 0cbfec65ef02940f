"""GRPO training on accelerate (the ``[train]`` extra), imported lazily.

Importing this package loads no torch: the config (:class:`GRPOConfig`,
:func:`load_config`) is light, and the recipe, the generation backends and the
token utilities load torch/transformers only when first used.

- :func:`train` / :func:`train_async`: the whole run (validate, launch under
  accelerate for several processes or DeepSpeed, train, register) returning a
  :class:`TrainResult`; ``vfops train`` and the ``train-grpo`` flow call it.
  :func:`resolve_config` applies a run's overrides and validates; :func:`check_resume`
  verifies a checkpoint folder; :func:`preflight` checks what a run needs besides its
  config (model folder, environment and its args, attention kernels); :data:`Progress`
  is the progress callback's type.
- :class:`GRPORecipe`: ``setup()``, ``train_step() -> dict[str, float]``,
  ``evaluate()``, ``train()``, ``save(dir)``, ``resume(dir)``, ``close()``.
- :class:`GRPOConfig` and its sections (:mod:`vfops._config` models); :func:`load_config`
  reads TOML and names every bad field at once, one line each (:func:`example_config`: a
  config shipped inside vfops, by name); ``config.with_overrides``
  changes it; :func:`config_help` lists every field's help text.
- :class:`HFBackend`: in-process generation; the vLLM backend lives in ``_vllm``.
- :class:`GenerationBackend`, :class:`TurnTokens`, :data:`TOKENS_KEY`: the backend contract.
- :func:`prefix_breaks`, :func:`suffix_ids`, :func:`rollout_sequences`: multi-turn
  token consistency (see ``vfops/training/_tokens.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vfops._lazy import lazy_exports

if TYPE_CHECKING:
    from vfops.training._backend import TOKENS_KEY, GenerationBackend, TurnTokens
    from vfops.training._config import (
        ConfigError,
        GRPOConfig,
        LossConfig,
        config_from_dict,
        config_help,
        example_config,
        load_config,
    )
    from vfops.training._generation_hf import HFBackend
    from vfops.training._loss import LossInputs, LossNorm
    from vfops.training._loss_names import LOSS_GROUP, loss_names
    from vfops.training._losses import LossVariant, TokenPPO, loss_variant, policy_loss
    from vfops.training._progress import Progress
    from vfops.training._recipe import GRPORecipe
    from vfops.training._run import (
        TrainingProcessError,
        TrainResult,
        check_resume,
        preflight,
        resolve_config,
        train,
        train_async,
    )
    from vfops.training._tokens import prefix_breaks, rollout_sequences, suffix_ids

__all__ = [
    "LOSS_GROUP",
    "TOKENS_KEY",
    "ConfigError",
    "GRPOConfig",
    "GRPORecipe",
    "GenerationBackend",
    "HFBackend",
    "LossConfig",
    "LossInputs",
    "LossNorm",
    "LossVariant",
    "Progress",
    "TokenPPO",
    "TrainResult",
    "TrainingProcessError",
    "TurnTokens",
    "check_resume",
    "config_from_dict",
    "config_help",
    "example_config",
    "load_config",
    "loss_names",
    "loss_variant",
    "policy_loss",
    "prefix_breaks",
    "preflight",
    "resolve_config",
    "rollout_sequences",
    "suffix_ids",
    "train",
    "train_async",
]

_LAZY = {
    "TOKENS_KEY": "vfops.training._backend",
    "GenerationBackend": "vfops.training._backend",
    "TurnTokens": "vfops.training._backend",
    "ConfigError": "vfops.training._config",
    "GRPOConfig": "vfops.training._config",
    "config_from_dict": "vfops.training._config",
    "config_help": "vfops.training._config",
    "example_config": "vfops.training._config",
    "load_config": "vfops.training._config",
    "HFBackend": "vfops.training._generation_hf",
    "LossConfig": "vfops.training._config",
    "LossInputs": "vfops.training._loss",
    "LossNorm": "vfops.training._loss",
    "policy_loss": "vfops.training._losses",
    "LOSS_GROUP": "vfops.training._loss_names",
    "LossVariant": "vfops.training._losses",
    "TokenPPO": "vfops.training._losses",
    "loss_names": "vfops.training._loss_names",
    "loss_variant": "vfops.training._losses",
    "GRPORecipe": "vfops.training._recipe",
    "Progress": "vfops.training._progress",
    "TrainResult": "vfops.training._run",
    "check_resume": "vfops.training._run",
    "TrainingProcessError": "vfops.training._run",
    "preflight": "vfops.training._run",
    "resolve_config": "vfops.training._run",
    "train": "vfops.training._run",
    "train_async": "vfops.training._run",
    "prefix_breaks": "vfops.training._tokens",
    "rollout_sequences": "vfops.training._tokens",
    "suffix_ids": "vfops.training._tokens",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
