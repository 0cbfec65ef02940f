"""No import cycle inside vfops: the modules' top-level imports form a DAG.

A cycle works until someone imports the modules in the other order and gets a
half-initialised module; this catches it from the source, whatever order tests run in.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import vfops

ROOT = Path(vfops.__file__).parent
PACKAGE = "vfops"


def module_names(root: Path = ROOT) -> dict[str, Path]:
    """Every importable module under ``root`` (templates are not modules)."""
    names: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root.parent).with_suffix("")
        if "templates" in relative.parts:
            continue
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_time_statements(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is imported: not in functions, not under
    ``if TYPE_CHECKING:``, but inside module-level ``if``/``try``/``with`` and classes."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from import_time_statements(node.body)
            yield from import_time_statements(node.orelse)
        elif isinstance(node, ast.ClassDef | ast.With):
            yield from import_time_statements(node.body)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from import_time_statements(block)
            for handler in node.handlers:
                yield from import_time_statements(handler.body)


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    if node.level:
        base = module.split(".")
        base = base[: len(base) - node.level + (1 if is_package else 0)]
        source = ".".join([*base, node.module] if node.module else base)
    else:
        source = node.module or ""
    yield source
    for alias in node.names:  # ``from pkg import submodule`` imports the submodule too
        yield f"{source}.{alias.name}"


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """``module -> the vfops modules its top-level imports load`` (explicit edges only:
    a submodule's implicit import of its parent package is not a cycle)."""
    modules = module_names(root)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges: set[str] = set()
        for node in import_time_statements(tree.body):
            for target in _targets(module, path.name == "__init__.py", node):
                if target in modules and target != module:
                    edges.add(target)
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle as ``[a, b, ..., a]``, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path = [start]
        stack = [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                state[path.pop()] = 2
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_vfops_imports_form_a_dag() -> None:
    graph = import_graph()
    assert "vfops.artifacts._open" in graph  # the walk saw the package
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_detector_names_a_cycle_it_is_given(tmp_path: Path) -> None:
    """A cycle through a package's __init__, a relative import and a class body."""
    pkg = tmp_path / "vfops" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "vfops" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from vfops.sub._a import A\n")
    (pkg / "_a.py").write_text("from ._b import B\nclass A(B): ...\n")
    (pkg / "_b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from vfops.sub._a import A\n"
        "def later():\n    from vfops.sub import A\n"
        "class B:\n    from vfops import sub\n"
    )
    cycle = find_cycle(import_graph(tmp_path / "vfops"))
    assert cycle == ["vfops.sub", "vfops.sub._a", "vfops.sub._b", "vfops.sub"]
    # neither TYPE_CHECKING nor function-level imports are edges
    (pkg / "_b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from vfops.sub._a import A\n"
        "def later():\n    from vfops.sub import A\n"
        "class B: ...\n"
    )
    assert find_cycle(import_graph(tmp_path / "vfops")) is None
