"""GRPO maths: group-relative advantages and the token-level clipped policy-gradient loss.

Heavy module (torch), imported lazily. Pure functions of tensors, so the loss
variants and the masking are unit-testable without a model: the loss takes its
tensors as one :class:`LossInputs` and its settings as the ``[loss]`` section
(:class:`~vfops.training._config.LossConfig`) itself, so a new setting is one field
of the config, not a parameter threaded through every caller.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vfops._errors import InvalidArgumentError
from vfops.training._config import LossConfig


def group_advantages(rewards: Sequence[float], *, scale: bool, eps: float = 1e-4) -> list[float]:
    """``r - mean(group)``, divided by the group's std (population) when ``scale``."""
    n = len(rewards)
    mean = sum(rewards) / n
    centred = [r - mean for r in rewards]
    if not scale:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / n)
    return [c / (std + eps) for c in centred]


@dataclass(frozen=True, slots=True)
class LossNorm:
    """Global denominators of one optimizer step, so micro-batches add up exactly.

    ``sequences``: sequences with at least one trained token (``grpo``);
    ``tokens``: trained tokens in the step (``bnpo``); ``dr_grpo`` divides by
    ``all_sequences * max_tokens`` (a constant, no length bias).
    """

    sequences: int
    all_sequences: int
    tokens: int
    max_tokens: int


def token_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    start: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each next token and the policy's entropy there.

    Position ``t`` of the result predicts token ``t + 1``; positions before ``start``
    are skipped (``[B, T-1-start]``): the prompt before the first trained token needs
    no logits, and at a vocabulary of ~150k the full ``[B, T, V]`` tensor is what
    runs out of memory first.
    """
    keep = input_ids.shape[1] - start
    extra = {"logits_to_keep": keep} if start > 0 and accepts_logits_to_keep(model) else {}
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **extra
    ).logits
    logits = logits[:, -keep:-1, :].float() / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.gather(-1, input_ids[:, start + 1 :].unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logprobs.exp() * logprobs).sum(-1)
    return chosen, entropy


def accepts_logits_to_keep(model: Any) -> bool:
    import inspect

    inner = model
    for attr in ("module", "base_model", "model"):  # DDP/DeepSpeed, peft wrappers
        if "logits_to_keep" in inspect.signature(inner.forward).parameters:
            return True
        inner = getattr(inner, attr, inner)
    return "logits_to_keep" in inspect.signature(inner.forward).parameters


@dataclass(frozen=True, slots=True)
class LossInputs:
    """The tensors of one micro-batch's loss, aligned ``[B, T]`` (``advantages``: ``[B]``).

    ``logprobs``: the trainer's log-probs of each next token (with grad);
    ``behaviour_logprobs``: what the sampler reported for the same tokens; ``mask``: 1 on
    trained tokens; ``ref_logprobs``: the frozen reference model's (``beta > 0`` only).
    One object rather than five positional tensors, so a new input is one field.
    """

    logprobs: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_logprobs: torch.Tensor | None = None


def policy_loss(
    inputs: LossInputs, config: LossConfig, norm: LossNorm
) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the step's loss, and sums for the step's metrics.

    The settings are ``[loss]``'s (:class:`LossConfig`): ``type``, ``clip_low``/``clip_high``,
    ``beta``, ``importance_correction`` (``correction`` below) and ``importance_cap``.

    ``correction = "none"``: the behaviour log-probs (what the sampler reported) are
    the old policy. Per token ``-min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)``
    with ``r = exp(logp - logp_behaviour)``.

    ``correction = "tis"`` (truncated importance sampling): the old policy is the
    trainer's own log-probs of the weights being updated (``logp`` detached: one
    optimizer step per batch, so every micro-batch sees the pre-step weights), and
    each token's clipped term is multiplied by the detached weight
    ``w = min(exp(logp_old - logp_behaviour), importance_cap)``, which corrects for
    the sampler computing slightly different log-probs (kernels, precision) and,
    with ``async_steps > 0``, for the batch coming from older weights. The gradient
    per trained token is then ``-w * A * d logp`` (over the loss type's denominator).

    Plus ``beta * KL`` (the k3 estimator against the reference model), not weighted.
    ``mask`` is 1 on sampled assistant tokens and 0 on prompt, environment, tool,
    padding and truncated tokens. The sums include the sampler/trainer mismatch on
    trained tokens: the k3 estimate of ``KL(behaviour || trainer)``, the extreme
    ratios ``exp(logp - logp_behaviour)``, and how many weights hit the cap.
    """
    logprobs, behaviour_logprobs = inputs.logprobs, inputs.behaviour_logprobs
    clip_low, clip_high, beta = config.clip_low, config.clip_high, config.beta
    correction, importance_cap = config.importance_correction, config.importance_cap
    ref_logprobs = inputs.ref_logprobs
    mask = inputs.mask.to(logprobs.dtype)
    trained = mask > 0
    with torch.no_grad():
        log_mismatch = torch.where(trained, logprobs - behaviour_logprobs, 0.0)
        mismatch = torch.exp(log_mismatch)
    if correction == "none":
        ratio = torch.exp(logprobs - behaviour_logprobs)
        weight = torch.ones_like(mismatch)
    elif correction == "tis":
        ratio = torch.exp(logprobs - logprobs.detach())
        weight = torch.clamp(mismatch, max=importance_cap)
    else:
        raise InvalidArgumentError(f"unknown importance correction {correction!r}; use none or tis")
    adv = inputs.advantages.unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.min(unclipped, clipped) * weight
    kl = torch.zeros_like(per_token)
    if beta > 0.0 and ref_logprobs is not None:
        delta = ref_logprobs - logprobs
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + beta * kl
    loss = _reduce(per_token, mask, config.type, norm)
    with torch.no_grad():
        was_clipped = ((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)).to(mask.dtype)
        sums = {
            "clipped_tokens": float((was_clipped * mask).sum()),
            "kl_sum": float((kl * mask).sum()),
            "ratio_sum": float((ratio * mask).sum()),
            "tokens": float(mask.sum()),
            **_mismatch_sums(
                mismatch,
                log_mismatch,
                weight,
                trained,
                importance_cap if correction == "tis" else None,
            ),
        }
    return loss, sums


def _mismatch_sums(
    mismatch: torch.Tensor,
    log_mismatch: torch.Tensor,
    weight: torch.Tensor,
    trained: torch.Tensor,
    cap: float | None,
) -> dict[str, float]:
    """Sampler/trainer mismatch on trained tokens: sums (``*_sum``, counts) add over
    micro-batches, ``*_max``/``*_min`` take the extreme; ``cap`` None: no correction."""
    if not bool(trained.any()):
        return {"mismatch_k3_sum": 0.0, "is_weight_sum": 0.0, "is_capped_tokens": 0.0}
    # E_behaviour[k3] = KL(behaviour || trainer); in float64: for a sampler that agrees to
    # 1e-4, float32 cancellation in r - 1 - log r would report noise or a negative value
    log_r = log_mismatch.double()
    k3 = (torch.expm1(log_r) - log_r).to(mismatch.dtype)
    ratios = mismatch[trained]
    return {
        "mismatch_k3_sum": float(k3[trained].sum()),
        "mismatch_ratio_max": float(ratios.max()),
        "mismatch_ratio_min": float(ratios.min()),
        "is_weight_sum": float(weight[trained].sum()),
        "is_capped_tokens": 0.0 if cap is None else float((ratios > cap).sum()),
    }


def _reduce(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, norm: LossNorm) -> Any:
    masked = per_token * mask
    if loss_type == "grpo":
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_seq.sum() / max(norm.sequences, 1)
    if loss_type == "bnpo":
        return masked.sum() / max(norm.tokens, 1)
    if loss_type == "dr_grpo":
        return masked.sum() / max(norm.all_sequences * norm.max_tokens, 1)
    raise InvalidArgumentError(f"unknown loss type {loss_type!r}; use grpo, dr_grpo or bnpo")
