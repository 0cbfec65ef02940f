"""The scripted model behind the v1 conformance tests: one reply function for every taskset
in tests/verifiers_v1_envs, a pure function of the request (its messages and the tools it
offers), so that vfops's eval and verifiers' ``vf-eval`` get the same answers for the same
conversation. Each taskset's prompts carry what the script keys on; some answers come out
wrong on purpose (the script sorts case-sensitively, knows four of five colours, bets on
its card), so a reward that is computed differently shows.

Run it with :class:`vfops.testing.StubServer`: ``StubConfig(reply_mode=reply)``.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from collections.abc import Callable
from typing import Any

from vfops.testing._stub_server import echo_answer_reply

Message = dict[str, Any]

KNOWN_COLOURS = {(255, 0, 0): "A", (0, 255, 0): "B", (0, 0, 255): "C", (255, 255, 0): "D"}
"""The colours the script can name (v1_picture has a fifth: its tasks with it go wrong)."""


def reply(request: dict[str, Any]) -> dict[str, Any]:
    """The assistant message the scripted model answers ``request`` with."""
    messages: list[Message] = request["messages"]
    tools = [t["function"]["name"] for t in request.get("tools") or []]
    for rule in RULES:
        found = rule(messages, tools)
        if found is not None:
            return found
    return said(echo_answer_reply(last_user_text(messages)))


def said(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def text_of(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def last_user_text(messages: list[Message]) -> str:
    users = [m for m in messages if m.get("role") == "user"]
    return text_of(users[-1].get("content")) if users else ""


def first_user_text(messages: list[Message]) -> str:
    users = [m for m in messages if m.get("role") == "user"]
    return text_of(users[0].get("content")) if users else ""


def tool_call(messages: list[Message], name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    call = {
        "id": f"call-{len(messages)}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def judge_verdict(messages: list[Message], tools: list[str]) -> dict[str, Any] | None:
    """verifiers' reference judge: its verdict labels, and whether the response's answer
    is the reference (ignoring case)."""
    text = last_user_text(messages)
    reference = re.search(r"Reference answer:\s*```\n(.*?)\n```", text, re.DOTALL)
    response = re.search(r"Response:\s*```\n(.*?)\n```", text, re.DOTALL)
    if reference is None or response is None:
        return None
    labels = re.search(r'Respond either "([^"]+)" or "([^"]+)"', text)
    positive, negative = labels.groups() if labels else ("yes", "no")
    tagged = re.search(r"<answer>(.*?)</answer>", response.group(1), re.DOTALL)
    answer = (tagged.group(1) if tagged else response.group(1)).strip()
    return said(positive if answer.lower() == reference.group(1).strip().lower() else negative)


def referee_verdict(messages: list[Message], tools: list[str]) -> dict[str, Any] | None:
    """v1_guarded's referee: VETO for a loud reply."""
    text = last_user_text(messages)
    if "Reply under review:" not in text:
        return None
    return said("VETO" if "loud" in text.split("Reply under review:")[-1] else "PASS")


def dictionary_lookup(messages: list[Message], tools: list[str]) -> dict[str, Any] | None:
    """v1_lookup: ask the dictionary for the quoted term, then answer with its definition."""
    name = next((t for t in tools if t.endswith("define")), None)
    if name is None:
        return None
    if messages[-1].get("role") == "tool":
        return said(f"<answer>{text_of(messages[-1].get('content'))}</answer>")
    term = re.search(r'"([^"]+)"', first_user_text(messages))
    return tool_call(messages, name, {"term": term.group(1) if term else ""})


def notebook_jots(messages: list[Message], tools: list[str]) -> dict[str, Any] | None:
    """v1_notes: one jot per listed word, then the notebook's last reply as the answer."""
    name = next((t for t in tools if t.endswith("jot")), None)
    listed = re.search(r"in order: (.*?)\. ", first_user_text(messages))
    if name is None or listed is None:
        return None
    words = listed.group(1).split()
    results = [m for m in messages if m.get("role") == "tool"]
    if len(results) < len(words):
        return tool_call(messages, name, {"word": words[len(results)]})
    return said(f"<answer>{text_of(results[-1].get('content'))}</answer>")


def duel_move(messages: list[Message], tools: list[str]) -> dict[str, Any] | None:
    """v1_duel: bet or call on a card of 3 or more, check or fold below; on a 1, no move
    at all (the seat forfeits after its second chance)."""
    system = " ".join(text_of(m.get("content")) for m in messages if m.get("role") == "system")
    card = re.search(r"Your card is (\d)", system)
    if card is None:
        return None
    if card.group(1) == "1":
        return said("I would rather not say.")
    legal = re.findall(r"\[(\w+)\]", last_user_text(messages))
    strong = int(card.group(1)) >= 3
    for move in ("bet", "call") if strong else ("check", "fold"):
        if move in legal:
            return said(f"I choose [{move}].")
    return said("No move fits.")


def picture_letters(messages: list[Message], tools: list[str]) -> dict[str, Any] | None:
    """v1_picture: the letters of every square shown so far, read from the PNGs."""
    urls = [
        part["image_url"]["url"]
        for m in messages
        if m.get("role") == "user" and isinstance(m.get("content"), list)
        for part in m["content"]
        if isinstance(part, dict) and part.get("type") == "image_url"
    ]
    if not urls:
        return None
    letters = "".join(KNOWN_COLOURS.get(first_pixel(url), "?") for url in urls)
    return said(f"<code>{letters}</code>")


def first_pixel(data_url: str) -> tuple[int, int, int]:
    """The first pixel of an unfiltered 8-bit RGB PNG given as a base64 ``data:`` URL."""
    png = base64.b64decode(data_url.split(",", 1)[1])
    at, idat = 8, b""
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        if png[at + 4 : at + 8] == b"IDAT":
            idat += png[at + 8 : at + 8 + length]
        at += 12 + length
    rows = zlib.decompress(idat)
    assert rows[0] == 0, "the script reads unfiltered rows only"
    return rows[1], rows[2], rows[3]


def sorted_list(messages: list[Message], tools: list[str]) -> dict[str, Any] | None:
    """v1_endless: every word added so far, sorted as Python sorts (capitals first)."""
    if "<list>" not in last_user_text(messages):
        return None
    words = [
        w.strip()
        for m in messages
        if m.get("role") == "user"
        for added in re.findall(r"Add (.*?) to the list", text_of(m.get("content")))
        for w in added.split(",")
    ]
    return said(f"<list>{', '.join(sorted(words))}</list>")


def said_exactly(messages: list[Message], tools: list[str]) -> dict[str, Any] | None:
    """v1_guarded: the word asked for."""
    asked = re.search(r"Say exactly: (.+)", last_user_text(messages))
    return said(asked.group(1).strip()) if asked else None


Rule = Callable[[list[Message], list[str]], "dict[str, Any] | None"]
RULES: tuple[Rule, ...] = (
    judge_verdict,
    referee_verdict,
    dictionary_lookup,
    notebook_jots,
    duel_move,
    picture_letters,
    sorted_list,
    said_exactly,
)
"""Tried in order; none matching, the ``ANSWER_HINT`` in the last user turn is echoed."""
