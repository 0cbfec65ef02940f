"""Padding-free micro-batches: a micro-batch's sequences concatenated into one row.

Heavy module (torch), used by the optimiser step when ``[optim] packing = true``.

Padded, a micro-batch of sequences of lengths n_1..n_B costs B x max(n) tokens of
compute; packed, sum(n). The row's ``position_ids`` restart at 0 at each sequence's
first token, and every attention implementation reads the sequence boundaries from
those restarts, so each sequence attends only to itself, as when padded:

- ``flash_attention_2``: no mask; transformers turns the restarts into the cumulative
  sequence lengths of flash-attn's varlen kernel (``cu_seqlens``; one row only, which
  is why a micro-batch packs into exactly one);
- ``sdpa``/``eager``: the block-diagonal causal mask :func:`block_causal_mask` builds
  from the same restarts, passed as a 4D mask, which transformers uses as given
  (boolean for sdpa; additive for eager, which adds it to the attention scores).

The log-probs come back in the loss's per-sequence layout (``[N, longest - 1]``, as
:func:`~vfops.training._batch.loss_targets` lays out the masks), so the loss (ratios,
clipping, per-sequence token means, the masks) is the same function on the same
tensors as padded. Only the positions whose next token is trained get logits
(``logits_to_keep`` given their indices): at a vocabulary of ~150k the logits are most
of a step's activation memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vfops.training._attention import FLASH
from vfops.training._loss import accepts_logits_to_keep
from vfops.training._tokens import Sequence


@dataclass(frozen=True, slots=True)
class PackedRow:
    """One micro-batch packed: the model's input, and where each trained position goes.

    ``keep[k]`` is a row position whose next token ``targets[k]`` is trained; it belongs
    to sequence ``sequence[k]`` at next-token position ``offset[k]`` of that sequence.
    """

    input_ids: torch.Tensor
    """``[1, L]``: the sequences one after another, no padding."""
    position_ids: torch.Tensor
    """``[1, L]``: 0, 1, ... restarting at each sequence (its boundaries)."""
    keep: torch.Tensor
    targets: torch.Tensor
    sequence: torch.Tensor
    offset: torch.Tensor
    shape: tuple[int, int]
    """The loss's layout: ``(sequences, longest - 1)``."""

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])


def pack(sequences: list[Sequence], device: Any) -> PackedRow:
    """``sequences`` concatenated into one row, positions restarting per sequence."""
    ids: list[int] = []
    positions: list[int] = []
    keep: list[int] = []
    which: list[int] = []
    offsets: list[int] = []
    for index, seq in enumerate(sequences):
        start = len(ids)
        ids.extend(seq.input_ids)
        positions.extend(range(len(seq.input_ids)))
        # next-token position t predicts token t + 1: trained where that token is
        trained = [t for t, m in enumerate(seq.loss_mask[1:]) if m]
        keep.extend(start + t for t in trained)
        which.extend([index] * len(trained))
        offsets.extend(trained)
    row = torch.tensor([ids], dtype=torch.long)
    kept = torch.tensor(keep, dtype=torch.long)
    longest = max(len(s.input_ids) for s in sequences)
    return PackedRow(
        input_ids=row.to(device),
        position_ids=torch.tensor([positions], dtype=torch.long).to(device),
        keep=kept.to(device),
        targets=row[0, kept + 1].to(device),
        sequence=torch.tensor(which, dtype=torch.long).to(device),
        offset=torch.tensor(offsets, dtype=torch.long).to(device),
        shape=(len(sequences), longest - 1),
    )


def block_causal_mask(position_ids: torch.Tensor, attn_implementation: str) -> torch.Tensor | None:
    """The attention mask of a packed row: causal within each sequence, nothing across.

    Sequences start where ``position_ids`` is 0 (the rule flash-attn's varlen path
    uses too, so every implementation sees the same boundaries). None for
    ``flash_attention_2``; ``[1, 1, L, L]`` otherwise: boolean (True: may attend) for
    sdpa, additive (0 or the float32 minimum) for eager.
    """
    if attn_implementation == FLASH:
        return None
    segment = (position_ids[0] == 0).cumsum(0)
    length = segment.shape[0]
    causal = torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()
    allowed = ((segment[:, None] == segment[None, :]) & causal)[None, None]
    if attn_implementation == "eager":
        blocked = torch.zeros(allowed.shape, dtype=torch.float32, device=allowed.device)
        return blocked.masked_fill(~allowed, torch.finfo(torch.float32).min)
    return allowed


def packed_token_logprobs(
    model: Any, row: PackedRow, mask: torch.Tensor | None, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each trained next token and the policy's entropy there, in the
    loss's ``[N, longest - 1]`` layout (0 at untrained positions, which the loss masks).

    ``mask``: :func:`block_causal_mask` of the row (built once per micro-batch, shared
    by the policy and the reference model).
    """
    extra = {"logits_to_keep": row.keep} if accepts_logits_to_keep(model) else {}
    logits = model(
        input_ids=row.input_ids,
        attention_mask=mask,
        position_ids=row.position_ids,
        use_cache=False,
        **extra,
    ).logits[0]
    if not extra:
        logits = logits[row.keep]
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
    chosen = logprobs.gather(-1, row.targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logprobs.exp() * logprobs).sum(-1)
    return _per_sequence(row, chosen), _per_sequence(row, entropy)


def _per_sequence(row: PackedRow, values: torch.Tensor) -> torch.Tensor:
    """``values`` (one per trained position) scattered into ``[N, longest - 1]``."""
    out = torch.zeros(row.shape, dtype=values.dtype, device=values.device)
    return out.index_put((row.sequence, row.offset), values)
