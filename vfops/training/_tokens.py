"""Multi-turn token consistency: token-in/token-out rollouts and the prefix property.

A chat template has the *incremental-prefix property* when rendering a longer
conversation starts with exactly the tokens of every earlier turn. Templates
such as Qwen3's break it: they strip ``<think>`` blocks from assistant turns
that precede the latest user message, so re-tokenising a conversation turns the
tokens the model actually sampled into different ones, and training on the
re-rendered text would compute log-probabilities of tokens nobody sampled.

Two explicit answers, chosen by ``[generation] multiturn_tokens``:

- ``continue`` (default): a later turn's prompt is the exact previous prompt +
  sampled completion + the tokenised *suffix* for the new environment/tool
  messages (:func:`suffix_ids`). The whole rollout is then one sequence whose
  assistant tokens are exactly what was sampled.
- ``retokenize``: every turn is rendered from messages (what a stateless server
  does). Where a turn's prompt does not extend the previous turn's tokens, the
  rollout is split into one training sequence per turn (:func:`rollout_sequences`),
  each exactly what that turn's generation saw and produced.

Light module: only the tokenizer object is touched, no torch import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vfops._text_parts import text_only
from vfops._types import Messages
from vfops.training._backend import TurnTokens

_DUMMY_USER = "vfops-suffix-probe-user"
_DUMMY_ASSISTANT = "vfops-suffix-probe-assistant"


class TemplateError(Exception):
    """The chat template cannot render a message suffix on its own."""


def render(
    tokenizer: Any,
    messages: Messages,
    tools: list[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool,
) -> str:
    text = tokenizer.apply_chat_template(
        text_only(messages),
        tools=tools or None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
    )
    return str(text)


def encode(tokenizer: Any, text: str) -> list[int]:
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def prompt_ids(
    tokenizer: Any, messages: Messages, tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """The template's rendering of ``messages`` plus the generation prompt, as token ids."""
    return encode(tokenizer, render(tokenizer, messages, tools, add_generation_prompt=True))


def suffix_ids(
    tokenizer: Any,
    new_messages: Messages,
    tools: list[dict[str, Any]] | None,
    *,
    last_sampled_id: int | None,
) -> list[int]:
    """Tokens that follow a sampled assistant turn: the end of that turn, ``new_messages``
    (environment/tool replies) and the next generation prompt.

    Rendered after a fixed probe conversation (so a template that rewrites earlier
    turns cannot touch the real ones), then diffed. The probe assistant turn's
    terminator (``<|im_end|>\\n`` in ChatML) is split around the token the model
    already sampled: when the model emitted ``<|im_end|>`` itself, only the rest
    (``\\n``) is added.
    """
    probe: Messages = [
        {"role": "user", "content": _DUMMY_USER},
        {"role": "assistant", "content": _DUMMY_ASSISTANT},
    ]
    base = render(tokenizer, probe, tools, add_generation_prompt=False)
    extended = render(tokenizer, [*probe, *new_messages], tools, add_generation_prompt=True)
    if not extended.startswith(base):
        raise TemplateError("the chat template rewrites the probe turn when messages follow")
    end = base.rfind(_DUMMY_ASSISTANT)
    if end < 0:
        raise TemplateError("the chat template drops assistant content")
    terminator = base[end + len(_DUMMY_ASSISTANT) :]
    if last_sampled_id is not None:
        sampled = str(tokenizer.decode([last_sampled_id], skip_special_tokens=False))
        if sampled and terminator.startswith(sampled):
            terminator = terminator[len(sampled) :]
    return encode(tokenizer, terminator + extended[len(base) :])


def prefix_breaks(
    tokenizer: Any, messages: Messages, tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """Indices of assistant messages whose tokens change when later turns are rendered.

    Empty when the template keeps the incremental-prefix property on ``messages``;
    non-empty for Qwen3-style templates that strip earlier ``<think>`` blocks.
    """
    full = encode(tokenizer, render(tokenizer, messages, tools, add_generation_prompt=False))
    broken: list[int] = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant" or i == len(messages) - 1:
            continue
        upto = encode(
            tokenizer, render(tokenizer, messages[: i + 1], tools, add_generation_prompt=False)
        )
        if full[: len(upto)] != upto:
            broken.append(i)
    return broken


@dataclass(slots=True)
class Sequence:
    """One training sequence: ids, which positions are trained, behaviour logprobs.

    ``loss_mask[i]`` is 1 where ``input_ids[i]`` was sampled by the policy (assistant
    tokens) and 0 for prompt, environment and tool tokens. ``old_logprobs[i]`` is
    the behaviour log-probability of ``input_ids[i]`` (0.0 where masked).
    """

    input_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    policy_version: int

    @property
    def completion_tokens(self) -> int:
        return sum(self.loss_mask)


def rollout_sequences(turns: list[TurnTokens]) -> list[Sequence]:
    """Training sequences of one rollout's turns.

    Consecutive turns whose prompt extends the previous prompt + completion are
    merged into one sequence (the tokens between them, environment and tool
    messages, are masked out of the loss). A turn that does not extend it starts
    a new sequence: the per-turn split, so every sequence is exactly what the
    policy saw and sampled.
    """
    sequences: list[Sequence] = []
    current: Sequence | None = None
    for turn in turns:
        prompt = turn["prompt_ids"]
        if current is not None and prompt[: len(current.input_ids)] == current.input_ids:
            gap = prompt[len(current.input_ids) :]
            current.input_ids.extend(gap)
            current.loss_mask.extend([0] * len(gap))
            current.old_logprobs.extend([0.0] * len(gap))
            current.policy_version = min(current.policy_version, turn["policy_version"])
        else:
            current = Sequence(
                input_ids=list(prompt),
                loss_mask=[0] * len(prompt),
                old_logprobs=[0.0] * len(prompt),
                policy_version=turn["policy_version"],
            )
            sequences.append(current)
        current.input_ids.extend(turn["completion_ids"])
        current.loss_mask.extend([1] * len(turn["completion_ids"]))
        current.old_logprobs.extend(float(x) for x in turn["completion_logprobs"])
    return sequences
