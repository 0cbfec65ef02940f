"""XML-tag parser: fields such as ``<think>...</think><answer>...</answer>``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from vfops._errors import VfopsError
from vfops._types import Messages
from vfops.parsers._parser import Parser, message_text

_TAG_NAME = re.compile(r"[A-Za-z_][\w.-]*\Z")
# Any XML-looking tag; only those naming a known field are structural, the rest is content.
_TAG = re.compile(r"<(/?)([A-Za-z_][\w.-]*)\s*>")


class XMLParser(Parser):
    """Parses XML-tagged fields; a tuple gives alternative tag names for one field.

    The first name of a tuple is canonical: ``parse`` returns an object with one
    attribute per canonical name (``None`` when absent), from the last occurrence.
    """

    def __init__(
        self, fields: Sequence[str | tuple[str, ...]], answer_field: str = "answer"
    ) -> None:
        if not fields:
            raise VfopsError("XMLParser needs at least one field, e.g. fields=['think', 'answer']")
        self._fields: list[tuple[str, ...]] = []
        self._canonical: dict[str, str] = {}  # every tag name -> its canonical name
        for spec in fields:
            names = (spec,) if isinstance(spec, str) else tuple(spec)
            if not names:
                raise VfopsError("XMLParser field tuples need at least one tag name")
            for name in names:
                if not isinstance(name, str) or not _TAG_NAME.match(name):
                    raise VfopsError(f"XMLParser: {name!r} is not a valid XML tag name")
                if name in self._canonical:
                    raise VfopsError(f"XMLParser: tag name {name!r} is given twice")
                self._canonical[name] = names[0]
            self._fields.append(names)
        if answer_field not in self._canonical:
            raise VfopsError(
                f"XMLParser: answer_field {answer_field!r} is not one of the fields "
                f"{[f[0] for f in self._fields]}"
            )
        self.answer_field = self._canonical[answer_field]
        # The backreference makes <answer>..</ans> not count as a closed answer field.
        self._patterns = {
            names[0]: re.compile(
                r"<(" + "|".join(re.escape(n) for n in names) + r")\s*>(.*?)</\1\s*>", re.DOTALL
            )
            for names in self._fields
        }

    @property
    def fields(self) -> list[str]:
        """Canonical field names, in declaration order."""
        return [names[0] for names in self._fields]

    def parse(self, text: str) -> Any:
        """An object with one attribute per canonical field (stripped text or None)."""
        values: dict[str, str | None] = {}
        for name, pattern in self._patterns.items():
            value: str | None = None
            for match in pattern.finditer(text):
                value = match.group(2).strip()
            values[name] = value
        return SimpleNamespace(**values)

    def parse_answer(self, completion: Messages | str) -> str | None:
        """The answer field of the last assistant message that has one."""
        for message in reversed(self.get_assistant_messages(completion)):
            value = getattr(self.parse(message_text(message)), self.answer_field)
            if value is not None:
                return str(value)
        return None

    def format(self, **kwargs: Any) -> str:
        """Render the given fields in declaration order; a key may be any alias."""
        unknown = [k for k in kwargs if k not in self._canonical]
        if unknown:
            raise VfopsError(f"XMLParser.format: unknown fields {unknown}; known: {self.fields}")
        parts: list[str] = []
        for names in self._fields:
            for name in names:
                if name in kwargs:
                    parts.append(f"<{name}>\n{kwargs[name]}\n</{name}>")
                    break
        return "\n".join(parts)

    def is_well_formed(self, text: str) -> bool:
        """Every known tag opened and closed, properly nested, no duplicated field,
        at least one field, and only whitespace outside the tags.

        Malformed messages score 0, not partial credit: partial credit rewards a
        model for emitting tags it never closes.
        """
        stack: list[str] = []
        seen: set[str] = set()
        position = 0
        for match in _TAG.finditer(text):
            closing, name = match.group(1), match.group(2)
            canonical = self._canonical.get(name)
            if canonical is None:
                continue  # an unknown tag is content; outside fields it fails below
            if not stack and text[position : match.start()].strip():
                return False
            if closing:
                if not stack or stack[-1] != name:
                    return False  # stray or mismatched closing tag
                stack.pop()
            else:
                if canonical in seen:
                    return False  # duplicated field (also via an alias)
                seen.add(canonical)
                stack.append(name)
            position = match.end()
        if stack or not seen:
            return False
        return not text[position:].strip()
