"""Deterministic "model" replies for the verifiers test environments.

``reply(request_json) -> assistant message`` is a ``reply_mode`` callable for
vfops' in-process stub server (``StubServer(StubConfig(reply_mode=reply))``).
It serves the four packages under ``tests/verifiers_envs`` and tells them apart
by the request alone: ``tools`` in the request is ``vf-tools``; otherwise the
system prompt names the guessing game (``vf-guess``) or the upper-case task
(``vf-group``'s ``upper``), and anything else is arithmetic (``vf-xml-math`` and
``vf-group``'s ``math``).

It keeps no state and draws no random numbers: each reply is a function of the
messages. Which behaviour a row gets (right, wrong, badly formatted, ...) is
:func:`mode_for` of the row's first user message, a stable CRC32 hash, so the
per-example rewards differ across examples but are the same on every run and
for every rollout of an example.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

Message = dict[str, Any]

# Behaviours per task, picked per row by ``mode_for``.
MATH_MODES = ("correct", "wrong", "answer_only", "plain", "empty")
"""``correct``: think + right answer (xml_math reward 1.2); ``wrong``: think +
answer + 1 (0.2); ``answer_only``: right ``<answer>`` without ``<think>`` (1.12);
``plain``: the right number in plain text, no tags (0.04); ``empty``: an empty
reply, which verifiers records as an ``EmptyModelResponseError`` (0.0)."""
GUESS_MODES = ("binary", "linear", "never")
"""``binary``: binary search from 8 (solves any secret within 5 turns);
``linear``: guesses 1, 2, 3, ... (solves secrets up to max_turns, at turn =
secret); ``never``: always guesses 0 (never solves, runs to max_turns)."""
TOOLS_MODES = ("correct", "wrong_final", "no_tools", "loop")
"""``correct``: add, multiply on add's result, answer multiply's result (3 turns);
``wrong_final``: the same calls, answers the result + 1; ``no_tools``: answers
the right number at once (1 turn); ``loop``: calls add every turn (max_turns)."""
UPPER_MODES = ("exact", "lower", "wrong")
"""``exact``: the word in upper case; ``lower``: the word in lower case;
``wrong``: ``BANANA``."""

_MODES = {"math": MATH_MODES, "guess": GUESS_MODES, "tools": TOOLS_MODES, "upper": UPPER_MODES}

_MATH_RE = re.compile(r"(-?\d+)\s*([-+*])\s*(-?\d+)")
_TOOLS_RE = re.compile(r"\((-?\d+)\s*\+\s*(-?\d+)\)\s*\*\s*(-?\d+)")
_GUESS_RE = re.compile(r"<guess>\s*(-?\d+)\s*</guess>")
_WORD_RE = re.compile(r"Word:\s*(\S+)")
GUESS_LOW, GUESS_HIGH = 1, 16
SALT = "s9"
"""Mixed into the hash; picked so that the first 8 rows of vf-xml-math, vf-guess and
vf-tools, and the 5 + 5 rows of vf-group, between them show every mode."""


def mode_for(task: str, question: str) -> str:
    """The stub's behaviour for a row of ``task`` ("math", "guess", "tools", "upper")
    whose first user message is ``question``."""
    modes = _MODES[task]
    return modes[zlib.crc32(f"{SALT}:{task}:{question}".encode()) % len(modes)]


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _first(messages: list[Message], role: str) -> str:
    for message in messages:
        if message.get("role") == role:
            return _text(message.get("content"))
    return ""


def task_of(request: dict[str, Any]) -> str:
    """Which test task a chat request belongs to."""
    if request.get("tools"):
        return "tools"
    system = _first(request["messages"], "system").lower()
    if "guessing game" in system:
        return "guess"
    if "upper case" in system:
        return "upper"
    return "math"


def _assistant(content: str) -> Message:
    return {"role": "assistant", "content": content}


def _math_reply(question: str) -> Message:
    mode = mode_for("math", question)
    match = _MATH_RE.search(question)
    if match is None:
        return _assistant("<think>no arithmetic found</think>\n<answer>unknown</answer>")
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    result = a + b if op == "+" else a - b if op == "-" else a * b
    if mode in ("correct", "wrong"):
        said = result if mode == "correct" else result + 1
        return _assistant(f"<think>\n{a} {op} {b} = {said}\n</think>\n<answer>\n{said}\n</answer>")
    if mode == "answer_only":
        return _assistant(f"<answer>{result}</answer>")
    if mode == "plain":
        return _assistant(f"The answer is {result}.")
    return _assistant("")  # "empty"


def next_guess(mode: str, messages: list[Message]) -> int:
    """The guess after the conversation so far (binary search reads the
    ``higher``/``lower`` replies; ``linear`` counts its own turns)."""
    low, high, turns = GUESS_LOW, GUESS_HIGH, 0
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        turns += 1
        match = _GUESS_RE.search(_text(message.get("content")))
        feedback = messages[i + 1] if i + 1 < len(messages) else None
        if match is None or feedback is None or feedback.get("role") != "user":
            continue
        guess, said = int(match.group(1)), _text(feedback.get("content")).strip().lower()
        if said == "higher":
            low = max(low, guess + 1)
        elif said == "lower":
            high = min(high, guess - 1)
    if mode == "binary":
        return (low + high) // 2
    if mode == "linear":
        return turns + 1
    return GUESS_LOW - 1  # "never"


def _guess_reply(question: str, messages: list[Message]) -> Message:
    return _assistant(f"<guess>{next_guess(mode_for('guess', question), messages)}</guess>")


def _tool_call(call_id: str, name: str, **arguments: int) -> Message:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


def _tools_reply(question: str, messages: list[Message]) -> Message:
    mode = mode_for("tools", question)
    match = _TOOLS_RE.search(question)
    if match is None:
        return _assistant("<answer>unknown</answer>")
    a, b, c = (int(g) for g in match.groups())
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    results = [_text(m.get("content")).strip() for m in messages if m.get("role") == "tool"]
    if mode == "no_tools":
        return _assistant(f"<answer>{(a + b) * c}</answer>")
    if mode == "loop" or not results:
        return _tool_call(f"call_{turn}_add", "add", a=a, b=b)
    if len(results) == 1:
        return _tool_call(f"call_{turn}_multiply", "multiply", a=int(results[0]), b=c)
    final = int(results[-1]) + (1 if mode == "wrong_final" else 0)
    return _assistant(f"<answer>{final}</answer>")


def _upper_reply(question: str) -> Message:
    mode = mode_for("upper", question)
    match = _WORD_RE.search(question)
    word = match.group(1) if match else ""
    if mode == "exact":
        return _assistant(word.upper())
    if mode == "lower":
        return _assistant(word.lower())
    return _assistant("BANANA")


def reply(request: dict[str, Any]) -> Message:
    """The assistant message for one chat-completions request (a ``reply_mode``)."""
    messages: list[Message] = request["messages"]
    question = _first(messages, "user")
    task = task_of(request)
    if task == "tools":
        return _tools_reply(question, messages)
    if task == "guess":
        return _guess_reply(question, messages)
    if task == "upper":
        return _upper_reply(question)
    return _math_reply(question)
