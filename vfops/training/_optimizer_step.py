"""The optimiser step: one batch in, ``[optim] updates_per_batch`` AdamW steps out (one by
default), and the step's metrics.

Heavy module (torch), imported lazily by the recipe. This is the trainer half of
the recipe (prime-rl's split): it knows nothing of generation, only the
:class:`~vfops.training._batch.Batch` it is handed. The batch is split into
``micro_batches`` contiguous chunks; each is padded, its log-probs computed from the
first trained position on (or, with ``[optim] packing``, packed into one row without
padding: :mod:`~vfops.training._packing`, the same loss per sequence), and its share
of the step's loss
(:func:`~vfops.training._losses.policy_loss`, normalised over the whole step by a
:class:`~vfops.training._loss.LossNorm`) back-propagated under
``accelerator.accumulate``; one clipped optimizer step follows, and after the last update
one LR-schedule step. From the second update on, the PPO ratio is against the log-probs
the first update computed (the weights before the batch's first step), so it moves away
from 1 and the clip binds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vfops.training._batch import (
    Batch,
    Sample,
    first_trained_position,
    loss_targets,
    pad,
    split,
)
from vfops.training._config import GenerationConfig, LossConfig, OptimConfig
from vfops.training._loss import LossInputs, LossNorm, token_logprobs
from vfops.training._losses import policy_loss
from vfops.training._packing import block_causal_mask, pack, packed_token_logprobs
from vfops.training._setup import Policy
from vfops.training._tokens import Sequence

Forward = Callable[[Any], tuple[torch.Tensor, torch.Tensor]]
"""A micro-batch's forward: model -> (log-probs, entropy), in the loss's layout."""


@dataclass(frozen=True, slots=True)
class _MicroInputs:
    """One micro-batch as the loss sees it: its forward, mask, behaviour log-probs and
    token count (padded or packed: the same mask and log-probs either way)."""

    forward: Forward
    mask: torch.Tensor
    old: torch.Tensor
    tokens: int
    """The micro-batch's real tokens (padding not counted)."""


@dataclass(frozen=True, slots=True)
class _Kept:
    """A micro-batch's first update, for the batch's later ones: its inputs, the reference
    model's log-probs (None without one) and the old policy's log-probs."""

    micro: _MicroInputs
    ref: torch.Tensor | None
    old: torch.Tensor


class OptimizerStep:
    """Trains ``policy`` on a batch: ``loss`` is ``[loss]``, ``optim`` gives the gradient
    clipping, ``generation`` the sampling temperature (the loss uses the same) and
    ``max_tokens`` (``dr_grpo``'s constant denominator)."""

    def __init__(
        self,
        policy: Policy,
        *,
        loss: LossConfig,
        optim: OptimConfig,
        generation: GenerationConfig,
    ) -> None:
        self.policy = policy
        self.loss = loss
        self.optim = optim
        self.generation = generation

    def run(self, batch: Batch) -> dict[str, float]:
        """Train on the batch ``[optim] updates_per_batch`` times, each an accumulation over
        its micro-batches and one optimizer step; the LR schedule advances once. Returns
        the step's sums over every update (``loss`` and ``grad_norm`` their mean) for
        :func:`step_metrics`."""
        policy = self.policy
        totals = {"loss": 0.0, "clipped_tokens": 0.0, "kl_sum": 0.0, "ratio_sum": 0.0}
        totals.update(tokens=0.0, entropy_sum=0.0, tokens_total=0.0, grad_norm=0.0)
        totals.update(mismatch_k3_sum=0.0, is_weight_sum=0.0, is_capped_tokens=0.0)
        totals.update(mismatch_ratio_max=-math.inf, mismatch_ratio_min=math.inf)
        norm = LossNorm(
            sequences=sum(1 for s in batch.samples if s.sequence.completion_tokens),
            all_sequences=len(batch.samples),
            tokens=sum(s.sequence.completion_tokens for s in batch.samples),
            max_tokens=self.generation.max_tokens,
        )
        chunks = split(batch.samples, policy.micro_batches)
        # What the first update computed for each micro-batch, kept for the later ones: its
        # inputs, the reference model's log-probs (they do not move) and the old policy's,
        # the first forward's log-probs, i.e. the weights before this batch's first
        # optimizer step (no extra forward; exact while dropout is off, the default).
        olds: list[_Kept | None] = [None] * len(chunks)
        updates = self.optim.updates_per_batch
        for _ in range(updates):
            self._update(chunks, norm, olds, totals)
        totals["loss"] /= updates
        totals["grad_norm"] /= updates
        policy.scheduler.step()
        return totals

    def _update(
        self,
        chunks: list[list[Sample]],
        norm: LossNorm,
        olds: list[_Kept | None],
        totals: dict[str, float],
    ) -> None:
        """One optimizer step: every micro-batch's share of the loss back-propagated under
        ``accelerator.accumulate``, the gradient clipped, the optimizer stepped."""
        policy = self.policy
        accelerator, n_micro = policy.accelerator, policy.micro_batches
        for index, chunk in enumerate(chunks):
            with accelerator.accumulate(policy.model):
                if chunk:
                    loss, sums, olds[index] = self._micro_step(chunk, norm, olds[index])
                    _accumulate(totals, sums)
                    totals["loss"] += float(loss.detach())
                    # accelerate divides by the accumulation steps; the loss is already
                    # normalised over the whole step, so undo it.
                    accelerator.backward(loss * n_micro)
                if accelerator.sync_gradients and self.optim.max_grad_norm > 0:
                    grad_norm = accelerator.clip_grad_norm_(
                        policy.model.parameters(), self.optim.max_grad_norm
                    )
                    totals["grad_norm"] += float(grad_norm) if grad_norm is not None else 0.0
                policy.optimizer.step()
                policy.optimizer.zero_grad(set_to_none=True)

    def _micro_step(
        self, chunk: list[Sample], norm: LossNorm, kept: _Kept | None
    ) -> tuple[Any, dict[str, float], _Kept]:
        """A micro-batch's loss, its metric sums, and what later updates of the batch reuse;
        ``kept``: what the first update kept (None: this is the first)."""
        policy = self.policy
        if kept is None:
            sequences = [s.sequence for s in chunk]
            micro = self._packed(sequences) if self.optim.packing else self._padded(sequences)
            ref = None
            if policy.ref_model is not None:
                with torch.no_grad():
                    ref, _ = micro.forward(policy.ref_model)
        else:
            micro, ref = kept.micro, kept.ref
        advantages = torch.tensor(
            [s.advantage for s in chunk], dtype=torch.float32, device=policy.accelerator.device
        )
        logprobs, entropy = micro.forward(policy.model)
        old = None if kept is None else kept.old
        loss, sums = policy_loss(
            LossInputs(
                logprobs, micro.old, advantages, micro.mask, ref_logprobs=ref, old_logprobs=old
            ),
            self.loss,
            norm,
        )
        sums["entropy_sum"] = float((entropy * micro.mask).sum())
        sums["tokens_total"] = float(micro.tokens)
        return loss, sums, kept or _Kept(micro, ref, logprobs.detach())

    def _padded(self, sequences: list[Sequence]) -> _MicroInputs:
        """Right-padded rows; logits from the first position any row trains on."""
        policy = self.policy
        ids, attention, mask, old = pad(sequences, policy.tokenizer, policy.accelerator.device)
        start = first_trained_position(mask)
        temperature = self.generation.temperature

        def forward(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
            return token_logprobs(model, ids, attention, temperature, start)

        return _MicroInputs(forward, mask[:, start:], old[:, start:], int(attention.sum()))

    def _packed(self, sequences: list[Sequence]) -> _MicroInputs:
        """One row without padding; logits only where a next token is trained."""
        policy = self.policy
        device = policy.accelerator.device
        row = pack(sequences, device)
        mask, old = loss_targets(sequences, device)
        attention = block_causal_mask(row.position_ids, policy.attn_implementation)
        temperature = self.generation.temperature

        def forward(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
            return packed_token_logprobs(model, row, attention, temperature)

        return _MicroInputs(forward, mask, old, row.tokens)

    @property
    def lr(self) -> float:
        """The learning rate of the last step."""
        return float(self.policy.scheduler.get_last_lr()[0])


def step_metrics(
    batch: Batch, stats: dict[str, float], *, lr: float, prefix_breaks: int
) -> dict[str, float]:
    """The step's logged metrics from its batch and :meth:`OptimizerStep.run`'s sums."""
    tokens = max(stats["tokens"], 1.0)
    rewards = batch.rewards or [0.0]
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return {
        "reward_mean": mean,
        "reward_std": std,
        "loss": stats["loss"],
        "kl": stats["kl_sum"] / tokens,
        "entropy": stats["entropy_sum"] / tokens,
        "clip_fraction": stats["clipped_tokens"] / tokens,
        "ratio_mean": stats["ratio_sum"] / tokens,
        "grad_norm": stats["grad_norm"],
        "lr": lr,
        "trained_tokens": stats["tokens"],
        "sequences": float(len(batch.samples)),
        "rollouts": float(batch.rollouts),
        "truncated_fraction": batch.truncated / max(batch.rollouts, 1),
        # groups whose rewards were all equal, left out by dynamic sampling (dapo)
        "groups_without_signal": float(batch.groups_without_signal),
        "prefix_breaks": float(prefix_breaks),
        # sampler vs trainer on the trained tokens (k3 estimate of KL(behaviour ||
        # trainer); ratio = exp(trainer - behaviour log-prob)); with async_steps > 0
        # this includes the lag, not just kernel and precision differences
        "mismatch_kl": stats["mismatch_k3_sum"] / tokens,
        "mismatch_ratio_max": _finite_or(stats["mismatch_ratio_max"], 1.0),
        "mismatch_ratio_min": _finite_or(stats["mismatch_ratio_min"], 1.0),
        "is_weight_mean": stats["is_weight_sum"] / tokens if stats["tokens"] else 1.0,
        "is_capped_fraction": stats["is_capped_tokens"] / tokens,
    }


def _accumulate(totals: dict[str, float], sums: dict[str, float]) -> None:
    """Add a micro-batch's sums into the step's; ``*_max``/``*_min`` keep the extreme."""
    for key, value in sums.items():
        if key.endswith("_max"):
            totals[key] = max(totals[key], value)
        elif key.endswith("_min"):
            totals[key] = min(totals[key], value)
        else:
            totals[key] += value


def _finite_or(value: float, default: float) -> float:
    return value if math.isfinite(value) else default
