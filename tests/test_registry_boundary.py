"""Every query on the registry's tables lives in ``vfops/registry/``.

Outside it, a registry ORM class may only be named in a type annotation (a
function's parameters or return, an annotated assignment) or imported: using it
as a value (``select(EvalRunRow)``, ``session.get(EvalRunRow, ...)``,
``EvalRunRow(...)``, ``EvalRunRow.status == ...``) builds a query, which belongs
in a named function of the registry. Raw SQL on a registry table and
``metadata.tables["..."]`` are refused likewise.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from vfops.registry import Base

ROOT = Path(__file__).resolve().parent.parent
# Shipped code. bench/ is left out: its raw-driver baseline writes the rollouts
# table directly on purpose, to measure the registry against it.
SCANNED = ("vfops", "environments")  # vfops/flows included
REGISTRY = ROOT / "vfops" / "registry"

ORM_NAMES = frozenset({"Base"} | {m.class_.__name__ for m in Base.registry.mappers})
TABLES = frozenset(Base.metadata.tables)
RAW_SQL = re.compile(rf"\b(?:FROM|INTO|UPDATE|JOIN|TABLE)\s+\"?({'|'.join(TABLES)})\b")


def _annotation_nodes(tree: ast.AST) -> set[int]:
    annotations: list[ast.expr | None] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
            annotations += [a.annotation for a in every]
            annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
    return {id(inner) for a in annotations if a is not None for inner in ast.walk(a)}


def registry_queries(source: str, filename: str = "<source>") -> list[str]:
    """Where ``source`` uses a registry ORM class or table outside an annotation."""
    tree = ast.parse(source, filename)
    allowed = _annotation_nodes(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Attribute):
            name = node.attr
        if name in ORM_NAMES and id(node) not in allowed:
            found.append(f"{filename}:{node.lineno}: {name} used as a value")
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
            key = node.slice
            if (
                node.value.attr == "tables"
                and isinstance(key, ast.Constant)
                and key.value in TABLES
            ):
                found.append(f"{filename}:{node.lineno}: table {key.value!r} looked up")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = RAW_SQL.search(node.value)
            if match:
                found.append(f"{filename}:{node.lineno}: raw SQL on {match.group(1)!r}")
    return sorted(found, key=lambda hit: int(hit.split(":")[-2]))


def _scanned_files() -> list[Path]:
    files = [path for folder in SCANNED for path in sorted((ROOT / folder).rglob("*.py"))]
    return [path for path in files if not path.is_relative_to(REGISTRY)]


def test_no_query_on_a_registry_table_outside_the_registry() -> None:
    files = _scanned_files()
    assert any(path.name == "_nightly.py" for path in files)  # the scan found the code
    found = [
        hit
        for path in files
        for hit in registry_queries(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not found, (
        "queries on registry tables outside vfops/registry/ (move each into a named "
        "function of the registry and call it):\n" + "\n".join(found)
    )


def test_the_check_sees_each_kind_of_query() -> None:
    source = """
from vfops.registry import EvalRunRow, AliasEventRow, Base
import vfops.registry as registry

def annotated(run: EvalRunRow, runs: list[EvalRunRow]) -> EvalRunRow | None:
    kept: EvalRunRow = run
    return kept

def queries(session):
    session.scalars(select(EvalRunRow).where(EvalRunRow.status == "completed"))
    session.get(registry.EvalRunRow, "id")
    session.add(AliasEventRow(actor="me"))
    Base.metadata.tables["rollouts"]
    session.execute(text('SELECT id FROM eval_runs'))
"""
    hits = registry_queries(source)
    lines = sorted(int(hit.split(":")[1]) for hit in hits)
    assert lines == [10, 10, 11, 12, 13, 13, 14], hits
