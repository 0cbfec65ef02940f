"""Evidence-gated alias promotion, and the train-evaluate-promote loop.

Importing this package is cheap: mlflow, torch and transformers load only when a
name below is first used.

- :func:`register_checkpoint`, :func:`load_model_dir` (re-exported from
  :mod:`vfops.checkpoints`, the layer below evaluation and training): a checkpoint as
  an MLflow model version, and back to a local directory.
- :func:`train_evaluate_promote`: the loop in one call: train with GRPO, register
  the checkpoint, promote it through the evidence gate (a refusal is returned).
- :func:`promote`: evaluate a candidate version (and the current alias holder) on
  gate environments, compare them with the nightly sweep's paired test, and move
  the alias only on evidence, and only if the holder it compared with still holds
  it (a compare-and-set under the registry's lock on that alias; else the gate runs
  again against the new holder, :class:`AliasContendedError` after 5 changes); every
  decision goes to the append-only ``alias_events`` table of the vfops registry
  (:func:`promotion_history`).

The MLflow store is :mod:`vfops.tracking`'s (:func:`vfops.tracking.tracking_uri`):
``MLFLOW_TRACKING_URI``, or by default the embedded
``sqlite:///$VFOPS_HOME/mlflow/mlflow.db`` with artifacts under
``$VFOPS_HOME/mlflow/artifacts``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vfops._lazy import lazy_exports

if TYPE_CHECKING:
    from vfops.checkpoints import (
        ModelVersionInfo,
        is_model_uri,
        load_model_dir,
        open_model_version_async,
        pin_model_uri,
        register_checkpoint,
    )
    from vfops.models._gate import EnvGateResult
    from vfops.models._loop import (
        LoopRequest,
        LoopResult,
        train_evaluate_promote,
        train_evaluate_promote_async,
    )
    from vfops.models._promotion import (
        AliasContendedError,
        AliasEventInfo,
        PromotionDecision,
        PromotionRefusedError,
        PromotionRequest,
        promote,
        promote_async,
        promotion_history,
    )

__all__ = [
    "AliasContendedError",
    "AliasEventInfo",
    "EnvGateResult",
    "LoopRequest",
    "LoopResult",
    "ModelVersionInfo",
    "PromotionDecision",
    "PromotionRefusedError",
    "PromotionRequest",
    "is_model_uri",
    "load_model_dir",
    "open_model_version_async",
    "pin_model_uri",
    "promote",
    "promote_async",
    "promotion_history",
    "register_checkpoint",
    "train_evaluate_promote",
    "train_evaluate_promote_async",
]

_LAZY = {
    "is_model_uri": "vfops.checkpoints",
    "open_model_version_async": "vfops.checkpoints",
    "pin_model_uri": "vfops.checkpoints",
    "ModelVersionInfo": "vfops.checkpoints",
    "load_model_dir": "vfops.checkpoints",
    "register_checkpoint": "vfops.checkpoints",
    "AliasContendedError": "vfops.models._promotion",
    "AliasEventInfo": "vfops.models._promotion",
    "EnvGateResult": "vfops.models._gate",
    "PromotionDecision": "vfops.models._promotion",
    "PromotionRefusedError": "vfops.models._promotion",
    "PromotionRequest": "vfops.models._promotion",
    "promote": "vfops.models._promotion",
    "promote_async": "vfops.models._promotion",
    "promotion_history": "vfops.models._promotion",
    "LoopRequest": "vfops.models._loop",
    "LoopResult": "vfops.models._loop",
    "train_evaluate_promote": "vfops.models._loop",
    "train_evaluate_promote_async": "vfops.models._loop",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
