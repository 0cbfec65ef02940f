"""Parsers: turn a model completion into the answer that reward functions grade."""

from vfops.parsers._parser import Parser, last_user_text, message_text
from vfops.parsers._think import MaybeThinkParser, ThinkParser, extract_boxed_answer
from vfops.parsers._xml import XMLParser

__all__ = [
    "MaybeThinkParser",
    "Parser",
    "ThinkParser",
    "XMLParser",
    "extract_boxed_answer",
    "last_user_text",
    "message_text",
]
