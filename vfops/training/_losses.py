"""The policy-gradient loss variants, one class each, found by name like environments.

A loss is a class registered under the ``vfops.losses`` entry-point group (vfops's own
below are registered there too, in pyproject.toml) and chosen with ``[loss] type``. It
turns one micro-batch's :class:`~vfops.training._loss.LossInputs` into that micro-batch's
share of the step's loss and the sums the step's metrics are made of
(:class:`LossVariant`). Shared parts — the importance ratio and the sampler-mismatch
weight (``importance_correction``), the k3 KL to a reference model, the metrics — live in
:mod:`vfops.training._loss`; a variant says what it does with them.

Notation, per trained token ``t`` of sequence ``i`` (``m_it`` = 1 on trained tokens): ``r_it
= exp(logp_it - logp_old_it)`` the PPO ratio (``old``: the behaviour log-probs with
``importance_correction = "none"``, the trainer's own log-probs before the batch's first
update otherwise, where ``r = 1`` in value on that first update), ``w_it`` the mismatch
weight (1 without correction), ``A_i`` the group-relative advantage, ``eps_l, eps_h`` =
``clip_low, clip_high``, ``N_tok`` the trained tokens of the step, ``N_seq`` its sequences
with a trained token, ``G`` all its sequences, ``L`` = ``max_tokens``. With one optimiser
step per generated batch (``[optim] updates_per_batch = 1``, the default) the ratio is 1 at
that step, so the PPO clip never binds (``clip 0.000`` in the metrics): the clip matters
from a batch's second update on (``updates_per_batch > 1``), for batches from older weights
with ``importance_correction = "none"`` (``async_steps > 0``), or with a sampler that
disagrees, where the mismatch weight is what corrects.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

from vfops._errors import InvalidArgumentError
from vfops.training._loss import cispo_terms, gspo_terms, ppo_token_terms
from vfops.training._loss_names import LOSS_GROUP, check_loss_name

if TYPE_CHECKING:
    import torch

    from vfops.training._config import LossConfig
    from vfops.training._loss import LossInputs, LossNorm


@runtime_checkable
class LossVariant(Protocol):
    """A loss variant: ``loss(inputs, config, norm)`` -> (this micro-batch's share of the
    step's loss, sums for the step's metrics). ``clip_low``/``clip_high``: its defaults
    when ``[loss]`` leaves them unset; ``dynamic_sampling``: whether groups whose
    rewards are all equal are left out of the step by default (DAPO)."""

    clip_low: ClassVar[float]
    clip_high: ClassVar[float]
    dynamic_sampling: ClassVar[bool]

    def loss(
        self, inputs: LossInputs, config: LossConfig, norm: LossNorm
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


def policy_loss(
    inputs: LossInputs, config: LossConfig, norm: LossNorm
) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the step's loss, and sums for the step's metrics: what
    the variant ``[loss] type`` names makes of them (:mod:`vfops.training._losses`)."""
    return loss_variant(config.type).loss(inputs, config, norm)


def loss_variant(name: str) -> LossVariant:
    """An instance of the variant installed under ``name``."""
    check_loss_name(name)
    (ep,) = [ep for ep in entry_points(group=LOSS_GROUP) if ep.name == name][:1]
    cls = ep.load()
    variant = cls() if isinstance(cls, type) else cls
    if not isinstance(variant, LossVariant):
        raise InvalidArgumentError(
            f"loss {name!r} ({ep.value}) lacks a loss(inputs, config, norm) method or its "
            "clip_low, clip_high and dynamic_sampling defaults"
        )
    return variant


class TokenPPO:
    """Shared by the token-level PPO variants: per token
    ``l_it = -min(r_it A_i, clip(r_it, 1 - eps_l, 1 + eps_h) A_i) w_it + beta k3_it``;
    a subclass says how the step's terms are averaged (:meth:`reduce`)."""

    clip_low: ClassVar[float] = 0.2
    clip_high: ClassVar[float] = 0.2
    dynamic_sampling: ClassVar[bool] = False

    def loss(
        self, inputs: LossInputs, config: LossConfig, norm: LossNorm
    ) -> tuple[torch.Tensor, dict[str, float]]:
        per_token, mask, sums = ppo_token_terms(inputs, config, self)
        return self.reduce(per_token * mask, mask, norm), sums

    def reduce(self, masked: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
        raise NotImplementedError


class GRPO(TokenPPO):
    """GRPO (DeepSeekMath): each sequence's token mean, averaged over sequences:
    ``L = (1/N_seq) sum_i (sum_t m_it l_it / sum_t m_it)``. Shorter sequences weigh more
    per token (the length bias Dr. GRPO removes)."""

    def reduce(self, masked: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_seq.sum() / max(norm.sequences, 1)


class DrGRPO(TokenPPO):
    """Dr. GRPO: the token sum over a constant, ``L = sum_it m_it l_it / (G L)``: no
    length bias (use it with ``scale_rewards = false``, as its authors do)."""

    def reduce(self, masked: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
        return masked.sum() / max(norm.all_sequences * norm.max_tokens, 1)


class DAPO(TokenPPO):
    """DAPO: token-level aggregation over the whole step, ``L = sum_it m_it l_it / N_tok``
    (every token weighs the same, however long its sequence); clip-higher (``eps_h`` 0.28
    against ``eps_l`` 0.2 by default, so unlikely tokens can grow); dynamic sampling: a
    group whose rewards are all equal (no signal) is left out of the step
    (``dynamic_sampling``; the step trains on fewer groups rather than sampling more)."""

    clip_high: ClassVar[float] = 0.28
    dynamic_sampling: ClassVar[bool] = True

    def reduce(self, masked: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
        return masked.sum() / max(norm.tokens, 1)


class GSPO:
    """GSPO: a sequence-level ratio, the geometric mean of its tokens' ratios,
    ``s_i = exp((1/|y_i|) sum_t m_it (logp_it - logp_old_it))``, clipped per sequence:
    ``l_i = -min(s_i A_i, clip(s_i, 1 - eps_l, 1 + eps_h) A_i) w_i`` (``w_i`` the sequence's
    mismatch weight, the same geometric mean of its tokens', capped or masked), then
    ``L = (1/N_seq) sum_i (l_i + beta mean_t k3_it)``. Its clip range is narrow (3e-4 /
    4e-4 by default, the paper's): a sequence ratio moves far less than a token's."""

    clip_low: ClassVar[float] = 3e-4
    clip_high: ClassVar[float] = 4e-4
    dynamic_sampling: ClassVar[bool] = False

    def loss(
        self, inputs: LossInputs, config: LossConfig, norm: LossNorm
    ) -> tuple[torch.Tensor, dict[str, float]]:
        return gspo_terms(inputs, config, self, norm)


class CISPO:
    """CISPO (MiniMax-M1): REINFORCE on every token with a clipped, stopped-gradient
    importance weight instead of PPO's clipped objective:
    ``l_it = -sg(min(r_it, 1 + eps_h) w_it) A_i logp_it + beta k3_it``, no lower bound on
    the weight (``clip_low`` is not used), ``L = sum_it m_it l_it / N_tok``. No token's
    gradient is dropped by the clip, only bounded."""

    clip_low: ClassVar[float] = 0.2
    clip_high: ClassVar[float] = 0.28
    dynamic_sampling: ClassVar[bool] = False

    def loss(
        self, inputs: LossInputs, config: LossConfig, norm: LossNorm
    ) -> tuple[torch.Tensor, dict[str, float]]:
        per_token, mask, sums = cispo_terms(inputs, config, self)
        return (per_token * mask).sum() / max(norm.tokens, 1), sums


def uses_dynamic_sampling(config: LossConfig) -> bool:
    """Whether the step leaves out groups whose rewards are all equal."""
    if config.dynamic_sampling is not None:
        return config.dynamic_sampling
    return bool(loss_variant(config.type).dynamic_sampling)
