"""Parsers for reasoning models that write ``<think>...</think>`` before the answer."""

from __future__ import annotations

from collections.abc import Callable

from vfops.parsers._parser import Parser

_OPEN, _CLOSE = "<think>", "</think>"


def _identity(text: str) -> str:
    return text


def extract_boxed_answer(text: str) -> str:
    r"""The content of the last ``\boxed{...}`` with balanced braces, else ``text``.

    Escaped braces (``\{``, ``\}``) do not count, so ``\boxed{\{1,2\}}`` works.
    """
    start = text.rfind("\\boxed{")
    while start != -1:
        content_start = start + len("\\boxed{")
        depth = 1
        i = content_start
        while i < len(text):
            char = text[i]
            if char == "\\":
                i += 2
                continue
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    return text[content_start:i]
            i += 1
        # Unbalanced (e.g. truncated output): fall back to an earlier \boxed.
        start = text.rfind("\\boxed{", 0, start)
    return text


class ThinkParser(Parser):
    """The completion must be ``<think>...</think>`` followed by the answer.

    ``parse`` returns ``extract_fn`` of the text after ``</think>``, or ``""`` when
    no think block was closed (the model never reached its answer).
    """

    def __init__(self, extract_fn: Callable[[str], str] = _identity) -> None:
        self.extract_fn = extract_fn

    def parse(self, text: str) -> str:
        _, closed, after = text.rpartition(_CLOSE)
        if not closed:
            return ""
        return self.extract_fn(after.strip())

    def is_well_formed(self, text: str) -> bool:
        """Exactly one think block, at the start, closed, with a non-empty answer after."""
        stripped = text.strip()
        if not stripped.startswith(_OPEN):
            return False
        if stripped.count(_OPEN) != 1 or stripped.count(_CLOSE) != 1:
            return False
        return bool(stripped.partition(_CLOSE)[2].strip())


class MaybeThinkParser(ThinkParser):
    """Strips a think block when there is one, otherwise parses the whole text.

    An opened but unclosed think block parses to ``""``: the text is all reasoning.
    """

    def parse(self, text: str) -> str:
        if _CLOSE in text:
            return super().parse(text)
        if text.lstrip().startswith(_OPEN):
            return ""
        return self.extract_fn(text.strip())

    def is_well_formed(self, text: str) -> bool:
        """Either a well-formed think block and answer, or non-empty text with no think tags."""
        if _OPEN not in text and _CLOSE not in text:
            return bool(text.strip())
        return super().is_well_formed(text)
