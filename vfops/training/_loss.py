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

    ``sequences``: sequences with at least one trained token (``grpo``, ``gspo``);
    ``tokens``: trained tokens in the step (``dapo``, ``cispo``); ``dr_grpo`` divides by
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
    trained tokens; ``ref_logprobs``: the frozen reference model's (``beta > 0`` only);
    ``old_logprobs``: the trainer's own log-probs before the batch's first optimizer step,
    given from its second update on (``[optim] updates_per_batch > 1``; None on the first,
    where they are ``logprobs``' own values). One object rather than six positional
    tensors, so a new input is one field.
    """

    logprobs: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class _Importance:
    """The ratio to the old policy and the sampler-mismatch weight of each token."""

    ratio: torch.Tensor
    weight: torch.Tensor
    mismatch: torch.Tensor
    log_mismatch: torch.Tensor
    cap: float | None


def importance(inputs: LossInputs, config: LossConfig) -> _Importance:
    """``importance_correction``:

    - ``"none"``: the behaviour log-probs (what the sampler reported) are the old policy,
      ``r = exp(logp - logp_behaviour)``, ``w = 1``;
    - ``"tis"`` (truncated importance sampling): the old policy is the trainer's own
      log-probs of the weights before the batch's first optimizer step (on that first
      update ``logp`` detached, so ``r = 1`` in value; on later ones, with
      ``updates_per_batch > 1``, ``inputs.old_logprobs``), and each token is weighted by
      ``w = min(exp(logp_old - logp_behaviour), importance_cap)``:
      the sampler's different kernels and precision, and with ``async_steps > 0`` a batch
      from older weights, are corrected for;
    - ``"mis"`` (masked importance sampling): the same old policy, ``w = exp(logp_old -
      logp_behaviour)`` where that is at most ``importance_cap`` and 0 (the token masked
      out) above it: a token the sampler and the trainer disagree on that much is not
      trained on rather than down-weighted.
    """
    logprobs, behaviour = inputs.logprobs, inputs.behaviour_logprobs
    old = logprobs.detach() if inputs.old_logprobs is None else inputs.old_logprobs
    trained = inputs.mask > 0
    with torch.no_grad():
        # the sampler against the trainer's pre-update weights: the same on every update
        log_mismatch = torch.where(trained, old - behaviour, 0.0)
        mismatch = torch.exp(log_mismatch)
    correction, cap = config.importance_correction, config.importance_cap
    if correction == "none":
        return _Importance(torch.exp(logprobs - behaviour), torch.ones_like(mismatch),
                           mismatch, log_mismatch, None)  # fmt: skip
    ratio = torch.exp(logprobs - old)
    if correction == "tis":
        return _Importance(ratio, torch.clamp(mismatch, max=cap), mismatch, log_mismatch, cap)
    if correction == "mis":
        weight = torch.where(mismatch <= cap, mismatch, torch.zeros_like(mismatch))
        return _Importance(ratio, weight, mismatch, log_mismatch, cap)
    raise InvalidArgumentError(
        f"unknown importance correction {correction!r}; use none, tis or mis"
    )


def _k3(inputs: LossInputs, config: LossConfig) -> torch.Tensor:
    """``beta``'s KL to the reference model per token, the k3 estimator
    ``exp(ref - logp) - (ref - logp) - 1`` (0 without a reference)."""
    if config.beta > 0.0 and inputs.ref_logprobs is not None:
        delta = inputs.ref_logprobs - inputs.logprobs
        return torch.exp(delta) - delta - 1.0
    return torch.zeros_like(inputs.logprobs)


def ppo_token_terms(
    inputs: LossInputs, config: LossConfig, variant: Any
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Per token ``-min(r A, clip(r, 1 - eps_l, 1 + eps_h) A) w + beta k3``, the mask (as
    the log-probs' dtype) and the step's sums (:mod:`vfops.training._losses`)."""
    clip_low, clip_high = resolved_clip(config, variant)
    mask = inputs.mask.to(inputs.logprobs.dtype)
    imp = importance(inputs, config)
    adv = inputs.advantages.unsqueeze(-1)
    clipped = torch.clamp(imp.ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.min(imp.ratio * adv, clipped) * imp.weight
    kl = _k3(inputs, config)
    per_token = per_token + config.beta * kl
    with torch.no_grad():
        out = (imp.ratio < 1.0 - clip_low) | (imp.ratio > 1.0 + clip_high)
        sums = _sums(imp, kl, mask, out.to(mask.dtype))
    return per_token, mask, sums


def cispo_terms(
    inputs: LossInputs, config: LossConfig, variant: Any
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Per token ``-sg(min(r, 1 + eps_h) w) A logp + beta k3`` (CISPO), the mask, sums."""
    _, clip_high = resolved_clip(config, variant)
    mask = inputs.mask.to(inputs.logprobs.dtype)
    imp = importance(inputs, config)
    coefficient = (torch.clamp(imp.ratio, max=1.0 + clip_high) * imp.weight).detach()
    adv = inputs.advantages.unsqueeze(-1)
    kl = _k3(inputs, config)
    per_token = -coefficient * adv * inputs.logprobs + config.beta * kl
    with torch.no_grad():
        sums = _sums(imp, kl, mask, (imp.ratio > 1.0 + clip_high).to(mask.dtype))
    return per_token, mask, sums


def gspo_terms(
    inputs: LossInputs, config: LossConfig, variant: Any, norm: LossNorm
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO's loss for the micro-batch (see :class:`vfops.training._losses.GSPO`)."""
    clip_low, clip_high = resolved_clip(config, variant)
    mask = inputs.mask.to(inputs.logprobs.dtype)
    lengths = mask.sum(-1).clamp(min=1.0)
    imp = importance(inputs, config)
    # sequence ratio and weight: the geometric means of the tokens'
    seq_ratio = torch.exp((torch.log(imp.ratio) * mask).sum(-1) / lengths)
    with torch.no_grad():
        seq_log_mismatch = (imp.log_mismatch * mask).sum(-1) / lengths
        seq_weight = torch.exp(seq_log_mismatch)
        if config.importance_correction == "tis":
            seq_weight = torch.clamp(seq_weight, max=config.importance_cap)
        elif config.importance_correction == "mis":
            seq_weight = torch.where(seq_weight <= config.importance_cap, seq_weight, 0.0)
        elif config.importance_correction == "none":
            seq_weight = torch.ones_like(seq_weight)
    adv = inputs.advantages
    clipped = torch.clamp(seq_ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_seq = -torch.min(seq_ratio * adv, clipped) * seq_weight
    kl = _k3(inputs, config)
    per_seq = per_seq + config.beta * (kl * mask).sum(-1) / lengths
    has_tokens = (mask.sum(-1) > 0).to(per_seq.dtype)
    loss = (per_seq * has_tokens).sum() / max(norm.sequences, 1)
    with torch.no_grad():
        out = ((seq_ratio < 1.0 - clip_low) | (seq_ratio > 1.0 + clip_high)).to(mask.dtype)
        # a clipped sequence clips every one of its tokens
        sums = _sums(imp, kl, mask, out.unsqueeze(-1).expand_as(mask))
    return loss, sums


def resolved_clip(config: LossConfig, variant: Any) -> tuple[float, float]:
    """``[loss]``'s clip range, each bound the variant's default where it is unset."""
    low = variant.clip_low if config.clip_low is None else config.clip_low
    high = variant.clip_high if config.clip_high is None else config.clip_high
    return float(low), float(high)


def _sums(
    imp: _Importance, kl: torch.Tensor, mask: torch.Tensor, out: torch.Tensor
) -> dict[str, float]:
    trained = mask > 0
    return {
        "clipped_tokens": float((out * mask).sum()),
        "kl_sum": float((kl * mask).sum()),
        "ratio_sum": float((imp.ratio.detach() * mask).sum()),
        "tokens": float(mask.sum()),
        **_mismatch_sums(imp.mismatch, imp.log_mismatch, imp.weight, trained, imp.cap),
    }


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
