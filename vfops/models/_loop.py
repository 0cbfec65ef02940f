"""Train, register, and promote on evidence: the platform's loop as one call.

:func:`train_evaluate_promote_async` trains a policy with GRPO (per-step metrics in
MLflow), registers the final checkpoint as a new version of a registered model,
and asks the evidence gate (:func:`vfops.models.promote_async`) to move an alias
(``champion``) to it. The gate evaluates the candidate and the current holder on
held-out environments; a refusal is a normal outcome here (returned, not raised),
so a caller — the ``train-evaluate-promote`` flow, ``vfops demo`` — reports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfops._errors import VfopsError
from vfops._twins import blocking_twin

if TYPE_CHECKING:
    from vfops.models._promotion import PromotionDecision
    from vfops.training import GRPOConfig, Progress, TrainResult


@dataclass(frozen=True)
class LoopResult:
    """What one turn of the loop produced."""

    training: TrainResult
    model_name: str
    version: str
    """The registered version of the trained checkpoint."""
    decision: PromotionDecision

    @property
    def model_uri(self) -> str:
        return f"models:/{self.model_name}/{self.version}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "training": self.training.summary(),
            "model_uri": self.model_uri,
            "decision": self.decision.to_dict(),
        }


@dataclass(frozen=True)
class LoopRequest:
    """One turn of the loop: what to train, the name to register it as, and the gate.

    Args:
        config: A training config, or the path of its TOML file.
        register_as: MLflow registered model name of the checkpoint.
        gate_envs: Installed environments the gate evaluates candidate and holder on.
        alias: The alias the candidate is promoted to on evidence.
        steps: Override ``[run] steps``.
        output_dir: Override ``[run] output_dir``.
        gate_examples: Examples per gate environment (N).
        gate_rollouts: Rollouts per example (R).
        gate_sampling_args: Sampling arguments of the gate's evaluations.
        gate_env_args: Gate environment -> its ``load_environment`` arguments.
    """

    config: GRPOConfig | str | Path
    register_as: str
    gate_envs: Sequence[str]
    alias: str = "champion"
    steps: int | None = None
    output_dir: str | Path | None = None
    gate_examples: int = 20
    gate_rollouts: int = 1
    gate_sampling_args: Mapping[str, Any] | None = None
    gate_env_args: Mapping[str, Mapping[str, Any]] | None = None


async def train_evaluate_promote_async(
    request: LoopRequest, *, progress: Progress | None = None
) -> LoopResult:
    """Train ``request.config``, register the checkpoint, gate it onto ``request.alias``.

    ``progress`` is called after every training eval and step.
    """
    from vfops.models._promotion import PromotionRequest, promote_async
    from vfops.training import train_async

    register_as = request.register_as
    if not request.gate_envs:
        raise VfopsError("no gate environment; name at least one (gate_envs / --gate-env)")
    training = await train_async(
        request.config,
        steps=request.steps,
        output_dir=request.output_dir,
        register_as=register_as,
        tracking=True,  # the checkpoint is registered in MLflow: its run goes there too
        progress=progress,
    )
    version = training.registered_version
    if version is None:
        raise VfopsError(
            f"training finished but registered no checkpoint as {register_as!r}; "
            "check the MLflow tracking store (MLFLOW_TRACKING_URI)"
        )
    gate = PromotionRequest(
        register_as,
        version,
        alias=request.alias,
        gate_envs=list(request.gate_envs),
        num_examples=request.gate_examples,
        rollouts_per_example=request.gate_rollouts,
        sampling_args=request.gate_sampling_args,
        env_args=request.gate_env_args,
    )
    decision = await promote_async(gate)
    return LoopResult(training, register_as, version, decision)


train_evaluate_promote = blocking_twin(train_evaluate_promote_async)
"""Synchronous :func:`train_evaluate_promote_async` (same arguments)."""
