"""Checkpoints in the MLflow model registry: registered from a model folder, opened again.

- :func:`register_checkpoint`: log a Hugging Face model directory (weights, tokenizer,
  config, generation config) as a new version of a registered model, tagged with its
  training run, base model and environment versions.
- :func:`load_model_dir`: download ``models:/NAME@alias`` or ``models:/NAME/VERSION`` to a
  local directory that :class:`vfops.local.LocalModelClient` can load;
  :func:`open_model_version_async` loads it in-process.

Below evaluation and training (both use it) and above tracking (MLflow) and local models;
promotion, which evaluates checkpoints, is :mod:`vfops.models`, above them. Importing this
package is cheap: mlflow, torch and transformers load when a name is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vfops._lazy import lazy_exports

if TYPE_CHECKING:
    from vfops.checkpoints._inprocess import (
        is_model_uri,
        open_model_version_async,
        pin_model_uri,
    )
    from vfops.checkpoints._registered import (
        ModelVersionInfo,
        load_model_dir,
        register_checkpoint,
        resolve_version,
    )

__all__ = [
    "ModelVersionInfo",
    "is_model_uri",
    "load_model_dir",
    "open_model_version_async",
    "pin_model_uri",
    "register_checkpoint",
    "resolve_version",
]

_LAZY = {
    "is_model_uri": "vfops.checkpoints._inprocess",
    "open_model_version_async": "vfops.checkpoints._inprocess",
    "pin_model_uri": "vfops.checkpoints._inprocess",
    "ModelVersionInfo": "vfops.checkpoints._registered",
    "load_model_dir": "vfops.checkpoints._registered",
    "register_checkpoint": "vfops.checkpoints._registered",
    "resolve_version": "vfops.checkpoints._registered",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
