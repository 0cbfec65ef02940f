"""Each package's public surface is its ``__all__``, and packages use only each other's.

Like httpx's exported-members test: every name a package exports exists, once
(ruff's RUF022 keeps the lists sorted). Across packages, no private name (``_x``) is
imported, and a name imported from another package's private module (allowed, to
keep imports lazy and light) must be one that package exports.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "vfops"
SKIP_PARTS = {"templates", "migrations"}


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if SKIP_PARTS.intersection(path.relative_to(ROOT).parts):
            continue
        parts = ["vfops", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append((".".join(parts), path))
    return found


def _packages() -> list[str]:
    return [name for name, path in _modules() if path.name == "__init__.py" and name != "vfops"]


def _owner(module: str) -> str:
    """The package a module path belongs to: up to its first private component."""
    parts = module.split(".")
    for index, part in enumerate(parts):
        if part.startswith("_"):
            return ".".join(parts[:index])
    return module


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rsplit(".", 1)[0]


def _within(package: str, owner: str) -> bool:
    return package == owner or package.startswith(owner + ".")


def cross_package_imports() -> list[tuple[str, int, str, str]]:
    """(file, line, imported module, name) of every import of another package's internals."""
    found = []
    for module, path in _modules():
        package = _package_of(module, path)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if not node.module.startswith("vfops.") or node.module == "vfops":
                continue
            owner = _owner(node.module)
            if _within(package, owner):
                continue
            for alias in node.names:
                found.append(
                    (str(path.relative_to(ROOT.parent)), node.lineno, node.module, alias.name)
                )
    return found


@pytest.mark.parametrize("package", _packages())
def test_every_exported_name_exists_once(package: str) -> None:
    module = importlib.import_module(package)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{package} has no __all__"
    assert len(exported) == len(set(exported)), f"{package}.__all__ repeats a name"
    missing = [name for name in exported if not hasattr(module, name)]
    assert not missing, f"{package}.__all__ names what it does not define: {missing}"


def test_no_private_name_is_imported_across_packages() -> None:
    offenders = [
        f"{file}:{line}: {name} from {module}"
        for file, line, module, name in cross_package_imports()
        if name.startswith("_")
    ]
    assert not offenders, "private names imported across packages:\n" + "\n".join(offenders)


def test_names_from_another_package_are_ones_it_exports() -> None:
    offenders = []
    for file, line, module, name in cross_package_imports():
        owner = _owner(module)
        if owner == "vfops" or name.startswith("_"):
            continue  # vfops' own top-level modules are shared by every package
        exported = getattr(importlib.import_module(owner), "__all__", ())
        if name not in exported:
            offenders.append(f"{file}:{line}: {name} from {module} (not in {owner}.__all__)")
    assert not offenders, "internals used across packages:\n" + "\n".join(offenders)


def test_no_package_imports_another_packages_private_module() -> None:
    """A package's ``__init__`` is its API: another package imports ``from vfops.clients
    import ChatResponse``, never ``from vfops.clients._base import ...`` (so a package may
    move its modules around without breaking another)."""
    offenders = sorted(
        {
            f"{file}:{line}: from {module}"
            for file, line, module, _ in cross_package_imports()
            if _owner(module) != "vfops" and module != _owner(module)
        }
    )
    assert not offenders, "private modules imported across packages:\n" + "\n".join(offenders)
