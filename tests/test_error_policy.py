"""User-facing errors are ``VfopsError``s: the CLI prints their one line, never a traceback.

A bare ``ValueError`` is raised only where pydantic expects one — inside a validator (a
``@field_validator``/``@model_validator`` method, a function passed to
``AfterValidator``/``BeforeValidator``/..., or a helper only such validators call), where
``ConfigModel`` collects it into its one-line-per-field error. A range check anywhere else
raises :class:`vfops._errors.InvalidArgumentError` (a ``VfopsError`` and a ``ValueError``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import vfops

ROOT = Path(vfops.__file__).parent
VALIDATOR_WRAPPERS = {"AfterValidator", "BeforeValidator", "PlainValidator", "WrapValidator"}
MODEL_FACING = {("vfops/envs/_tool.py", "_decode_arguments")}
"""Errors a model reads back, not a user: a tool call's bad arguments come back to the
model as ``Error: ValueError: ...``, the name verifiers' environments give it."""

Function = ast.FunctionDef | ast.AsyncFunctionDef


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        return _name(node.func)
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _raises_value_error(function: Function) -> list[int]:
    lines = []
    for node in ast.walk(function):
        if isinstance(node, ast.Raise) and node.exc is not None and _name(node.exc) == "ValueError":
            lines.append(node.lineno)
    return lines


def _validators(tree: ast.Module, functions: dict[str, Function]) -> set[str]:
    """The module's pydantic validators, and the helpers only they reach (by name)."""
    found = {
        name
        for name, function in functions.items()
        if any(_name(decorator).endswith("validator") for decorator in function.decorator_list)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) in VALIDATOR_WRAPPERS:
            found |= {_name(arg) for arg in node.args if _name(arg) in functions}
    grown = True
    while grown:  # helpers the validators call
        called = {
            _name(node.func)
            for name in found
            for node in ast.walk(functions[name])
            if isinstance(node, ast.Call) and _name(node.func) in functions
        }
        grown = not called <= found
        found |= called
    return found


def stray_value_errors(root: Path = ROOT) -> list[str]:
    stray = []
    for path in sorted(root.rglob("*.py")):
        if "templates" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        functions = {
            node.name: node
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        allowed = _validators(tree, functions)
        where = str(path.relative_to(root.parent))
        for name, function in functions.items():
            if name in allowed or (where, name) in MODEL_FACING:
                continue
            for line in _raises_value_error(function):
                stray.append(f"{where}:{line} in {name}")
    return sorted(set(stray))


def test_value_errors_are_raised_only_for_pydantic() -> None:
    stray = stray_value_errors()
    assert not stray, (
        "raise InvalidArgumentError (vfops._errors) instead of ValueError:\n" + "\n".join(stray)
    )


def test_the_check_tells_a_validator_from_a_range_check(tmp_path: Path) -> None:
    package = tmp_path / "vfops"
    package.mkdir()
    (package / "_m.py").write_text(
        "from pydantic import AfterValidator, field_validator\n"
        "def _url(v):\n    _check(v)\n    return v\n"
        "def _check(v):\n    if not v:\n        raise ValueError('empty')\n"
        "Url = AfterValidator(_url)\n"
        "class C:\n"
        "    @field_validator('x')\n"
        "    def _x(cls, v):\n        raise ValueError('bad x')\n"
        "def scale(n):\n    if n < 1:\n        raise ValueError('n must be >= 1')\n"
    )
    assert stray_value_errors(package) == ["vfops/_m.py:15 in scale"]


def test_an_invalid_argument_is_both_kinds() -> None:
    from vfops._errors import InvalidArgumentError, VfopsError

    error = InvalidArgumentError("n must be >= 1")
    assert isinstance(error, VfopsError) and isinstance(error, ValueError)
