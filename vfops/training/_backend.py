"""The contract between the GRPO recipe and a generation backend.

A backend hands environments an ordinary :class:`vfops.clients.ModelClient`, so
rollouts for training come from exactly the same Environment API as eval
(multi-turn and tools included). What training needs beyond eval travels in
``ChatResponse.raw`` under :data:`TOKENS_KEY` as a :class:`TurnTokens` dict:
the exact token ids the model saw and produced for that turn, and the behaviour
policy's log-probabilities of the produced tokens (for the importance ratio).

Backends: in-process Hugging Face generation (``_generation_hf``, CPU and small
runs) and a vLLM server through the OpenAI API (``_vllm``) with weight sync
after each optimizer step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypedDict, runtime_checkable

from vfops._errors import VfopsError
from vfops.clients import TOKENS_KEY

__all__ = ["TOKENS_KEY", "GenerationBackend", "SamplingArgsError", "TurnTokens"]

if TYPE_CHECKING:
    import torch

    from vfops.clients import ModelClient


class SamplingArgsError(VfopsError, ValueError):
    """The environment asked a training backend for sampling it cannot do (``top_p`` in
    the in-process one, ``n > 1``, streaming). A user error (the environment's or the
    run's ``sampling_args``), and still a ``ValueError`` for callers that caught one."""


class TurnTokens(TypedDict):
    """One assistant turn, token-in/token-out.

    ``prompt_ids``: every token the model was conditioned on for this turn (the
    whole conversation so far, template tokens included). ``completion_ids``: the
    sampled tokens, in order, including a final end-of-turn token when one was
    sampled. ``completion_logprobs``: the behaviour policy's log-probability of
    each sampled token (same length as ``completion_ids``), at the sampling
    temperature the backend reports in ``temperature``.
    ``policy_version``: the optimizer step whose weights generated the turn
    (bounds off-policyness when generation runs ahead of training).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    temperature: float
    policy_version: int


@runtime_checkable
class GenerationBackend(Protocol):
    """What the recipe drives: a client for environments, and weight sync."""

    @property
    def client(self) -> ModelClient:
        """The client environments call; every response carries :class:`TurnTokens`."""
        ...

    async def sync_weights(self, model: torch.nn.Module, policy_version: int) -> float:
        """Make generation use ``model``'s current weights; returns the seconds it took."""
        ...

    async def aclose(self) -> None: ...
