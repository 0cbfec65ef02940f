"""Modules with one job and functions a reader can hold: the sizes vfops keeps to.

No file in ``vfops/`` over ``MAX_FILE_LINES``; no function over ``MAX_FUNCTION_LINES``
(a CLI command's option declarations are its signature, so a function is measured from its
first statement); none with more than ``MAX_PARAMETERS`` parameters outside the CLI
commands, whose parameters are their flags, and the Prefect flows (``vfops/flows``), whose
parameters are their deployment's form (a new setting is a field of a typed request
object, not one more argument).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import vfops

ROOT = Path(vfops.__file__).parent
MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 100
MAX_PARAMETERS = 10

Function = ast.FunctionDef | ast.AsyncFunctionDef


def source_files(root: Path = ROOT) -> list[Path]:
    return sorted(path for path in root.rglob("*.py") if "templates" not in path.parts)


def functions(tree: ast.AST) -> Iterator[Function]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def body_lines(function: Function) -> int:
    """From the first statement (a docstring included) to the last line."""
    return (function.end_lineno or function.lineno) - function.body[0].lineno + 1


def parameter_count(function: Function) -> int:
    """Every parameter a caller can pass, ``self``/``cls`` not counted."""
    args = function.args
    names = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    count = len(names) + (args.vararg is not None) + (args.kwarg is not None)
    if names and names[0].arg in ("self", "cls"):
        count -= 1
    return count


def oversized(root: Path = ROOT) -> list[str]:
    found = []
    for path in source_files(root):
        text = path.read_text()
        where = path.relative_to(root.parent)
        lines = len(text.splitlines())
        if lines > MAX_FILE_LINES:
            found.append(f"{where}: {lines} lines (at most {MAX_FILE_LINES})")
        # a command's parameters are its flags, a flow's its deployment's form
        is_cli = path.relative_to(root).parts[0] in ("cli", "flows")
        for function in functions(ast.parse(text)):
            size = body_lines(function)
            if size > MAX_FUNCTION_LINES:
                found.append(f"{where}:{function.lineno} {function.name}: {size} lines")
            count = parameter_count(function)
            if count > MAX_PARAMETERS and not is_cli:
                found.append(f"{where}:{function.lineno} {function.name}: {count} parameters")
    return found


def test_no_module_or_function_is_oversized() -> None:
    assert len(source_files()) > 100  # the walk saw the package
    found = oversized()
    assert not found, "oversized:\n" + "\n".join(found)


def test_the_measure_catches_each_kind(tmp_path: Path) -> None:
    package = tmp_path / "vfops"
    (package / "cli").mkdir(parents=True)
    many = ", ".join(f"a{i}" for i in range(MAX_PARAMETERS + 1))
    long_body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES + 1))
    (package / "_big.py").write_text("\n" * MAX_FILE_LINES + "x = 1\n")
    (package / "_long.py").write_text(f"def f():\n{long_body}\n")
    (package / "_wide.py").write_text(
        f"class C:\n    def m(self, {many}): ...\n    def ok(self, {many[4:]}): ...\n"
    )
    # a CLI command: many flags are fine, a signature over many lines too
    flags = ",\n".join(f"    a{i}: int = 1" for i in range(MAX_FUNCTION_LINES))
    (package / "cli" / "_cmd.py").write_text(f"def command(\n{flags},\n):\n    return 1\n")
    (package / "flows").mkdir()
    (package / "flows" / "nightly.py").write_text(f"def flow({many}): ...\n")
    assert oversized(package) == [
        f"vfops/_big.py: {MAX_FILE_LINES + 1} lines (at most {MAX_FILE_LINES})",
        f"vfops/_long.py:1 f: {MAX_FUNCTION_LINES + 1} lines",
        f"vfops/_wide.py:2 m: {MAX_PARAMETERS + 1} parameters",
    ]
