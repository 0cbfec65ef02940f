"""The one multi-turn continuation strategy of the training backends (``hf`` and ``vllm``).

A backend's client only sees chat messages, so to continue a rollout from the
exact tokens of its earlier turns it must recognise the conversation. Both
backends do it the same way, here: :class:`TurnMemory` remembers each turn it
produced under the conversation *up to and including the assistant message it
returned* (plus the tools), in an LRU. A later call whose messages contain that
assistant message finds the turn again, whatever asyncio task runs it (a
``ContextVar`` would only follow one task, and ``asyncio.wait_for`` or a
``create_task`` inside an environment would lose it).

A found turn is *taken*: rollouts of a group often share their conversation
text exactly (same question, same short reply), and each must continue its own
turn (its own tokens and, in the ``hf`` backend, its own seed stream), not the
same one. A conversation continued twice from the same turn renders the second
time.

What the next prompt is (``[generation] multiturn_tokens``):

- ``continue``: previous prompt + previous completion + :func:`suffix_ids` for the
  new messages, so the rollout's assistant tokens are exactly what was sampled.
  Where the template cannot render the suffix alone, or no turn is found, the
  messages are rendered afresh.
- ``retokenize``: always rendered afresh (what a stateless server sees); the turn
  is still looked up, for its place in the conversation.

Light module: only the tokenizer object is touched, no torch import.
"""

from __future__ import annotations

import array
import collections
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from vfops._types import Message, Messages
from vfops.training._tokens import TemplateError, prompt_ids, suffix_ids

PromptSource = Literal["continued", "rendered", "given"]
PROMPT_SOURCE_KEY = "vfops_prompt_source"
"""Key in ``ChatResponse.raw``: how the turn's prompt ids were obtained."""
TokenMode = Literal["continue", "retokenize"]


@dataclass(frozen=True, slots=True)
class Turn:
    """One generated turn as remembered: its exact tokens and its place in the rollout.

    ``conversation`` and ``index`` let a backend derive per-turn sampling seeds
    (the ``hf`` backend); ids are kept as compact int arrays (many turns are held).
    """

    prompt: array.array[int]
    completion: array.array[int]
    conversation: int
    index: int

    @classmethod
    def of(
        cls, prompt_ids: list[int], completion_ids: list[int], conversation: int = 0, index: int = 0
    ) -> Turn:
        return cls(
            array.array("q", prompt_ids), array.array("q", completion_ids), conversation, index
        )


@dataclass(frozen=True, slots=True)
class Prompt:
    """The prompt ids of a new turn, how they were made, and the turn they follow."""

    ids: list[int]
    source: PromptSource
    previous: Turn | None
    consistent: bool
    """Whether ``ids`` equal a fresh rendering of the messages (False: the template
    would have changed earlier tokens, e.g. a Qwen3-style ``<think>`` strip)."""


class TurnMemory:
    """Chat messages -> prompt token ids, continuing earlier turns token-exactly.

    ``capacity``: turns remembered (LRU), at least the number of rollouts in flight;
    an evicted conversation is rendered afresh (correct tokens, no continuation).
    """

    def __init__(self, tokenizer: Any, *, mode: TokenMode = "continue", capacity: int = 8192):
        self.tokenizer = tokenizer
        self.mode = mode
        self.capacity = capacity
        self.prefix_breaks = 0
        """Continued turns whose exact tokens differ from re-rendering the messages."""
        self._turns: collections.OrderedDict[bytes, list[Turn]] = collections.OrderedDict()
        # A completion that ends with one of these may be the template's end-of-turn
        # token: suffix_ids then adds only the rest of the turn's terminator.
        self._special = {int(i) for i in getattr(tokenizer, "all_special_ids", [])}

    def prompt(
        self, messages: Messages, tools: list[dict[str, Any]] | None, *, take: bool = True
    ) -> Prompt:
        """The prompt ids for generating the next turn of ``messages``.

        ``take=False`` only looks (the turn stays available to the next call).
        """
        found = self._find(messages, tools, take)
        if found is None:
            return Prompt(prompt_ids(self.tokenizer, messages, tools), "rendered", None, True)
        k, previous = found
        if self.mode == "retokenize":
            return Prompt(prompt_ids(self.tokenizer, messages, tools), "rendered", previous, True)
        last = previous.completion[-1] if previous.completion else None
        try:
            suffix = suffix_ids(
                self.tokenizer,
                messages[k + 1 :],
                tools,
                last_sampled_id=last if last in self._special else None,
            )
        except TemplateError:
            return Prompt(prompt_ids(self.tokenizer, messages, tools), "rendered", previous, True)
        ids = [*previous.prompt, *previous.completion, *suffix]
        consistent = ids == prompt_ids(self.tokenizer, messages, tools)
        self.prefix_breaks += 0 if consistent else 1
        return Prompt(ids, "continued", previous, consistent)

    def remember(
        self, messages: Messages, tools: list[dict[str, Any]] | None, reply: Message, turn: Turn
    ) -> None:
        """Remember ``turn``, which answered ``messages`` with ``reply``."""
        key = _conversation_key([*messages, reply], tools)
        self._turns.setdefault(key, []).append(turn)
        self._turns.move_to_end(key)
        while len(self._turns) > self.capacity:
            self._turns.popitem(last=False)

    def _find(
        self, messages: Messages, tools: list[dict[str, Any]] | None, take: bool
    ) -> tuple[int, Turn] | None:
        """The turn that produced the latest assistant message of ``messages``, and its index."""
        for k in range(len(messages) - 1, -1, -1):
            if messages[k].get("role") != "assistant":
                continue
            key = _conversation_key(messages[: k + 1], tools)
            turns = self._turns.get(key)
            if not turns:
                return None  # an assistant turn this backend did not produce: render
            if not take:
                return k, turns[0]
            turn = turns.pop(0)  # first in, first out: deterministic under asyncio
            if not turns:
                del self._turns[key]
            return k, turn
        return None


def _canonical(message: Message) -> dict[str, Any]:
    """What identifies a message in a conversation; assistant messages by what the
    template renders (environments may add bookkeeping keys to them)."""
    if message.get("role") == "assistant":
        return {
            "role": "assistant",
            "content": message.get("content") or "",
            "tool_calls": message.get("tool_calls") or [],
        }
    return {k: v for k, v in message.items() if v is not None}


def _conversation_key(messages: Messages, tools: list[dict[str, Any]] | None) -> bytes:
    return orjson.dumps(
        [[_canonical(m) for m in messages], tools or []],
        option=orjson.OPT_SORT_KEYS,
        default=str,
    )
