"""One step's training data: rollouts turned into token sequences with advantages.

Heavy module (torch, for padding), imported lazily by the recipe. The generation
scheduler (:mod:`vfops.training._generation`) produces a :class:`Batch` per step
with :func:`to_batch`; the optimiser step (:mod:`vfops.training._optimizer_step`)
splits it into micro-batches and pads them (or packs them: :mod:`vfops.training._packing`).
Both halves meet here so that what a sample *is* (a sequence, its masks and behaviour
log-probs, its group-relative advantage) is defined once, and a checkpoint can store
the batches generated ahead as plain dicts (:func:`batch_from_dict` reads them back).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vfops._errors import VfopsError
from vfops._types import State
from vfops.rubrics import RolloutScore
from vfops.training._backend import TOKENS_KEY, TurnTokens
from vfops.training._config import LossConfig
from vfops.training._loss import group_advantages
from vfops.training._tokens import Sequence, rollout_sequences

Groups = list[tuple[list[State], list[RolloutScore]]]
"""What a step's generation returns: per prompt, its rollouts' states and scores."""


@dataclass(slots=True)
class Sample:
    """One trained sequence and the advantage of the rollout it came from."""

    sequence: Sequence
    advantage: float


@dataclass(slots=True)
class Batch:
    """One step's rollouts, ready to train on."""

    index: int
    samples: list[Sample]
    rewards: list[float]
    generation_s: float
    generated_tokens: int
    truncated: int
    rollouts: int
    min_policy_version: int
    groups_without_signal: int = 0
    """Groups left out because their rewards were all equal (``dynamic_sampling``)."""


def to_batch(index: int, groups: Groups, generation_s: float, loss: LossConfig) -> Batch:
    """Step ``index``'s batch: group-relative advantages per prompt and agent (a group
    with fewer than two scored rollouts has no baseline and is skipped), every rollout split into
    token sequences, truncated completions masked out when ``loss.mask_truncated``."""
    from vfops.training._losses import uses_dynamic_sampling

    samples: list[Sample] = []
    rewards: list[float] = []
    generated = truncated = rollouts = without_signal = 0
    min_version = index  # no turn can be newer than the step that trains on it
    drop_flat = uses_dynamic_sampling(loss)
    for kept in (role for states, scores in groups for role in _role_groups(states, scores)):
        if len(kept) < 2:  # no baseline to compare with
            continue
        group_rewards = [float(r) for _, r in kept]
        flat = drop_flat and max(group_rewards) == min(group_rewards)
        without_signal += int(flat)
        advantages = group_advantages(group_rewards, scale=loss.scale_rewards)
        for (state, reward), advantage in zip(kept, advantages, strict=True):
            turns = _turn_tokens(state)
            rollouts += 1
            rewards.append(float(reward))
            generated += sum(len(t["completion_ids"]) for t in turns)
            is_truncated = state.get("stop_reason") == "length"
            truncated += int(is_truncated)
            if flat:  # counted above (its reward, tokens, truncation), never trained on
                continue
            for seq in rollout_sequences(turns):
                if is_truncated and loss.mask_truncated:
                    seq.loss_mask = [0] * len(seq.loss_mask)
                min_version = min(min_version, seq.policy_version)
                samples.append(Sample(seq, advantage))
    return Batch(
        index, samples, rewards, generation_s, generated, truncated, rollouts, min_version,
        groups_without_signal=without_signal,
    )  # fmt: skip


def _role_groups(
    states: list[State], scores: list[RolloutScore]
) -> list[list[tuple[State, float]]]:
    """A prompt's scored rollouts as one group per agent: an episode of several agents
    (two seats of a game, a solver and its proposer) gives each seat its own baseline,
    the traces of the same seat across the prompt's episodes. A trace of a seat its
    ``Env`` does not train (``trainable`` false: a judge, a simulated user) is left out."""
    by_agent: dict[str, list[tuple[State, float]]] = {}
    for state, score in zip(states, scores, strict=True):
        if state.get("error") is not None or score.reward is None:
            continue
        if not state.get("trainable", True):
            continue
        by_agent.setdefault(str(state.get("agent", "")), []).append((state, score.reward))
    return list(by_agent.values())


def batch_from_dict(fields: dict[str, Any]) -> Batch:
    """The inverse of ``dataclasses.asdict(batch)`` (how a checkpoint stores batches)."""
    samples = [
        Sample(Sequence(**sample["sequence"]), sample["advantage"]) for sample in fields["samples"]
    ]
    return Batch(**{**fields, "samples": samples})


def _turn_tokens(state: State) -> list[TurnTokens]:
    turns: list[TurnTokens] = []
    for response in state.get("responses", []):
        raw = getattr(response, "raw", None) or {}
        tokens = raw.get(TOKENS_KEY)
        if tokens is None:
            raise VfopsError(
                "a model response carries no token ids; train through a training backend "
                "([generation] backend = 'hf' or 'vllm'), not a plain client"
            )
        turns.append(tokens)
    return turns


def split(samples: list[Sample], parts: int) -> list[list[Sample]]:
    """``parts`` contiguous chunks of near-equal size (some may be empty)."""
    size, extra = divmod(len(samples), parts)
    chunks: list[list[Sample]] = []
    start = 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        chunks.append(samples[start:end])
        start = end
    return chunks


def pad(
    sequences: list[Sequence], tokenizer: Any, device: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids and attention, and the next-token-aligned loss mask and old logprobs."""
    width = max(len(s.input_ids) for s in sequences)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(sequences), width), int(pad_id), dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        n = len(seq.input_ids)
        ids[row, :n] = torch.tensor(seq.input_ids)
        attention[row, :n] = 1
    mask, old = loss_targets(sequences, device)
    return ids.to(device), attention.to(device), mask, old


def loss_targets(sequences: list[Sequence], device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss mask and behaviour log-probs per sequence, next-token aligned and
    right-padded (``[N, longest - 1]``: position ``t`` predicts token ``t + 1``): the
    loss's layout whether the model's input was padded or packed."""
    width = max(len(s.input_ids) for s in sequences)
    mask = torch.zeros((len(sequences), width), dtype=torch.float32)
    old = torch.zeros((len(sequences), width), dtype=torch.float32)
    for row, seq in enumerate(sequences):
        n = len(seq.input_ids)
        mask[row, :n] = torch.tensor(seq.loss_mask, dtype=torch.float32)
        old[row, :n] = torch.tensor(seq.old_logprobs, dtype=torch.float32)
    return mask[:, 1:].to(device), old[:, 1:].to(device)


def first_trained_position(mask: torch.Tensor) -> int:
    """The first next-token position any row trains on (0 when none does)."""
    trained = mask.sum(0).nonzero()
    return int(trained[0]) if len(trained) else 0
