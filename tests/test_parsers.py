"""Parsers: answer extraction and format rewards."""

from __future__ import annotations

from typing import Any

import pytest

from vfops._errors import VfopsError
from vfops.parsers import (
    MaybeThinkParser,
    Parser,
    ThinkParser,
    XMLParser,
    extract_boxed_answer,
)


def assistant(content: object) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


# --- Parser ---------------------------------------------------------------------------


def test_parser_is_identity_on_last_assistant_message() -> None:
    parser = Parser()
    completion = [
        assistant("first"),
        {"role": "tool", "content": "tool output"},
        assistant("second"),
    ]
    assert parser.parse("x") == "x"
    assert parser.parse_answer(completion) == "second"
    assert parser.parse_answer("bare string") == "bare string"
    assert parser.parse_answer([{"role": "user", "content": "hi"}]) is None
    assert [m["content"] for m in parser.get_assistant_messages(completion)] == [
        "first",
        "second",
    ]


def test_parser_handles_none_and_list_content() -> None:
    parser = Parser()
    parts = [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]
    assert parser.parse_answer([assistant(parts)]) == "ab"
    assert parser.parse_answer([assistant(None)]) == ""


def test_base_format_reward() -> None:
    reward = Parser().get_format_reward_func()
    assert reward.__name__ == "format_reward"
    assert reward([assistant("anything")]) == 1.0
    assert reward([]) == 0.0


# --- XMLParser ------------------------------------------------------------------------


def test_xml_parse_takes_last_occurrence_and_none_when_absent() -> None:
    parser = XMLParser(["think", "answer"])
    parsed = parser.parse("<answer>1</answer> then <answer>\n 2 \n</answer>")
    assert parsed.answer == "2"
    assert parsed.think is None


def test_xml_alternative_tag_names_map_to_canonical_field() -> None:
    parser = XMLParser([("reasoning", "think"), ("answer", "final")])
    parsed = parser.parse("<think>hmm</think><final>7</final>")
    assert parsed.reasoning == "hmm"
    assert parsed.answer == "7"
    assert not hasattr(parsed, "think")
    # An alias does not close another alias of the same field.
    assert parser.parse("<answer>7</final>").answer is None


def test_xml_parse_answer_uses_last_assistant_message_with_answer() -> None:
    parser = XMLParser(["think", "answer"])
    completion = [
        assistant("<answer>early</answer>"),
        {"role": "user", "content": "<answer>user</answer>"},
        assistant("<answer>late</answer>"),
        assistant("<think>no answer here</think>"),
    ]
    assert parser.parse_answer(completion) == "late"
    assert parser.parse_answer([assistant("nothing")]) is None


def test_xml_format_renders_fields_in_declared_order() -> None:
    parser = XMLParser(["think", ("answer", "final")])
    assert parser.format(final="4", think="t") == "<think>\nt\n</think>\n<final>\n4\n</final>"
    assert parser.parse(parser.format(think="t", answer="4")).answer == "4"
    with pytest.raises(VfopsError, match="unknown"):
        parser.format(bogus="x")


def test_xml_rejects_bad_configuration() -> None:
    with pytest.raises(VfopsError):
        XMLParser(["think"], answer_field="answer")
    with pytest.raises(VfopsError):
        XMLParser(["answer", ("final", "answer")])
    with pytest.raises(VfopsError):
        XMLParser(["not a tag"])


@pytest.mark.parametrize(
    "text",
    [
        "<think>a</think><answer>4</answer>",
        "\n  <think>\na\n</think>\n\n<answer>4</answer>\n",
        "<answer>4</answer>",
        "<think>x < y and <b>bold</b></think><answer>4</answer>",
        "<think>a<answer>4</answer></think>",  # properly nested
        "<reasoning>a</reasoning><answer>4</answer>",  # alias
    ],
)
def test_xml_format_reward_well_formed_scores_one(text: str) -> None:
    reward = XMLParser([("think", "reasoning"), "answer"]).get_format_reward_func()
    assert reward([assistant(text)]) == 1.0


@pytest.mark.parametrize(
    "text",
    [
        "<think>a</think><answer>4",  # unclosed
        "<think>a<answer>4</answer>",  # unclosed outer
        "<think><answer></think></answer>",  # mismatched
        "<think>a</think></answer><answer>4</answer>",  # stray closing tag
        "<think>a</think><answer>4</answer></answer>",  # stray closing tag at the end
        "<answer>1</answer><answer>2</answer>",  # duplicated field
        "<think>a</think><reasoning>b</reasoning><answer>4</answer>",  # duplicated via alias
        "<think>a</reasoning><answer>4</answer>",  # alias mismatch
        "Sure! <think>a</think><answer>4</answer>",  # text outside
        "<think>a</think>4<answer>4</answer>",  # text between fields
        "<think>a</think><answer>4</answer> done",  # text after
        "<b>x</b><answer>4</answer>",  # unknown tag outside the fields
        "just an answer",  # no field at all
        "",
    ],
)
def test_xml_format_reward_malformed_scores_zero(text: str) -> None:
    reward = XMLParser([("think", "reasoning"), "answer"]).get_format_reward_func()
    assert reward([assistant(text)]) == 0.0


def test_xml_format_reward_is_fraction_of_assistant_messages() -> None:
    reward = XMLParser(["think", "answer"]).get_format_reward_func()
    completion = [
        assistant("<answer>1</answer>"),
        {"role": "user", "content": "again"},
        assistant("<answer>2"),
        # Tool-call-only turns have no text to be malformed and are not counted.
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
    ]
    assert reward(completion) == 0.5
    assert reward("<answer>1</answer>") == 1.0


# --- ThinkParser / MaybeThinkParser ---------------------------------------------------


def test_think_parser_returns_text_after_think_block() -> None:
    parser = ThinkParser()
    assert parser.parse("<think>\nreasoning\n</think>\n The answer ") == "The answer"
    assert parser.parse("no think block") == ""
    assert parser.parse("<think>never closed") == ""
    boxed = ThinkParser(extract_boxed_answer)
    assert boxed.parse_answer([assistant("<think>r</think> so \\boxed{3}")]) == "3"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>r</think>answer", 1.0),
        ("  <think>r</think>\nanswer\n", 1.0),
        ("answer", 0.0),  # no think block
        ("pre <think>r</think>answer", 0.0),  # not at the start
        ("<think>r</think><think>s</think>answer", 0.0),  # two blocks
        ("<think>r answer", 0.0),  # not closed
        ("<think>r</think>  \n", 0.0),  # nothing after it
    ],
)
def test_think_format_reward(text: str, expected: float) -> None:
    assert ThinkParser().get_format_reward_func()([assistant(text)]) == expected


def test_maybe_think_parser() -> None:
    parser = MaybeThinkParser(extract_boxed_answer)
    assert parser.parse("<think>\\boxed{1}</think> \\boxed{2}") == "2"
    assert parser.parse("plain \\boxed{5}") == "5"
    assert parser.parse("plain text") == "plain text"
    # Unclosed reasoning has no answer, even if it mentions a boxed value.
    assert parser.parse("<think>maybe \\boxed{9}") == ""
    reward = parser.get_format_reward_func()
    assert reward([assistant("no think tags")]) == 1.0
    assert reward([assistant("<think>r</think>ans")]) == 1.0
    assert reward([assistant("<think>r ans")]) == 0.0


# --- extract_boxed_answer -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{{a}+{b}}", "{a}+{b}"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces do not count
        ("\\boxed{3} and a truncated \\boxed{4", "3"),  # unbalanced last one
        ("no box here", "no box here"),
        ("\\boxed{}", ""),
    ],
)
def test_extract_boxed_answer(text: str, expected: str) -> None:
    assert extract_boxed_answer(text) == expected
