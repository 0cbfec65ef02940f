"""OpenAI tool schemas from Python signatures and docstrings."""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Collection
from typing import Any

_SIMPLE_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    dict: "object",
    list: "array",
}


def tool_schema(func: Callable[..., Any], *, skip: Collection[str] = ()) -> dict[str, Any]:
    """The ``{"type": "function", "function": {...}}`` schema of ``func``.

    Parameter types come from annotations; descriptions from a Google-style
    ``Args:`` section or Sphinx ``:param name:`` lines. Parameters in ``skip``
    are hidden (StatefulToolEnv injects them from the rollout state).
    """
    signature = inspect.signature(func)
    hints = typing.get_type_hints(func)
    summary, param_docs = parse_docstring(inspect.getdoc(func) or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in signature.parameters.items():
        if name in skip or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        prop = json_type(hints.get(name, Any))
        if name in param_docs:
            prop["description"] = param_docs[name]
        if param.default is inspect.Parameter.empty:
            required.append(name)
        properties[name] = prop
    return {
        "type": "function",
        "function": {
            "name": func.__name__,
            "description": summary,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def json_type(annotation: Any) -> dict[str, Any]:
    """JSON-schema fragment for a Python annotation."""
    if annotation in _SIMPLE_TYPES:
        return {"type": _SIMPLE_TYPES[annotation]}
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        non_null = [a for a in args if a is not type(None)]
        if len(non_null) == 1:
            return json_type(non_null[0])
        return {"anyOf": [json_type(a) for a in non_null]}
    if origin in (list, tuple, set, frozenset, Collection, typing.Sequence):
        return {"type": "array", "items": json_type(args[0]) if args else {}}
    if origin is dict:
        return {"type": "object"}
    return {}


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters)\s*:\s*$")
_SECTION_HEADER = re.compile(r"^\s*(Returns|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_GOOGLE_PARAM = re.compile(r"^\s+(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_PARAM = re.compile(r"^\s*:param\s+(?:\w+\s+)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a docstring into its summary paragraph and per-parameter descriptions."""
    lines = doc.splitlines()
    summary_lines: list[str] = []
    params: dict[str, str] = {}
    current: str | None = None
    in_args = False
    for line in lines:
        if _ARGS_HEADER.match(line):
            in_args, current = True, None
            continue
        if _SECTION_HEADER.match(line):
            in_args, current = False, None
            continue
        sphinx = _SPHINX_PARAM.match(line)
        if sphinx:
            current = sphinx.group(1)
            params[current] = sphinx.group(2).strip()
            continue
        if in_args:
            google = _GOOGLE_PARAM.match(line) if line.startswith((" ", "\t")) else None
            if google and (current is None or _indent(line) <= _indent_of_param(lines, current)):
                current = google.group(1).lstrip("*")
                params[current] = google.group(3).strip()
            elif current and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
            continue
    # The summary is the first paragraph: the model sees it as the tool's description.
    for line in lines:
        if not line.strip() or _ARGS_HEADER.match(line) or _SPHINX_PARAM.match(line):
            break
        summary_lines.append(line.strip())
    return " ".join(summary_lines), params


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _indent_of_param(lines: list[str], name: str) -> int:
    for line in lines:
        match = _GOOGLE_PARAM.match(line)
        if match and match.group(1).lstrip("*") == name:
            return _indent(line)
    return 0
