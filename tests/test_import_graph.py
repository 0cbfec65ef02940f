"""vfops' layers hold for every import, the ones made inside functions included.

Each vfops package sits on one layer (``LAYERS``, bottom first; the README's
Architecture section states the same table, checked below) and imports only packages on
layers below its own. A lazy import of a heavy third-party package stays lazy (that is
``tests/test_import_smoke.py``'s business), but a lazy import of another vfops package is
an arrow like any other: a function-local import that runs upward is still a dependency a
reader has to know about, and it is how cycles hide. ``if TYPE_CHECKING:`` imports are
not arrows (they never run).

Two more graphs are checked: the modules' import-time imports form a DAG (a cycle there is
a half-initialised module, whatever order the tests import things in), and no vfops module
outside ``vfops.flows`` imports a flow (the CLI finds flow definitions by their entry point,
a file path).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import vfops

ROOT = Path(vfops.__file__).parent
README = ROOT.parent / "README.md"
CORE = "vfops"  # the package's own private modules: vfops/_errors.py, vfops/_config.py, ...

# Bottom first. A package imports only packages on a lower line. Keep in step with the
# README's Architecture section (test_the_readme_states_the_layers).
LAYERS: tuple[tuple[str, ...], ...] = (
    (CORE,),
    ("parsers", "stats", "artifacts", "costs", "testing", "sandbox"),
    ("registry", "clients", "reports"),
    ("rubrics", "local", "budget"),
    ("orchestration",),
    ("tracking",),
    ("envs", "checkpoints"),
    ("adapters", "publishing", "judging"),
    ("evaluation",),
    ("training",),
    ("models", "sweeps"),
    ("nightly",),
    ("demo", "stack"),
    ("cli", "flows"),
)


def layer_of(package: str) -> int:
    for index, names in enumerate(LAYERS):
        if package in names:
            return index
    raise AssertionError(f"vfops.{package} is on no layer: add it to LAYERS and the README")


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


def package_of(module: str, root: Path = ROOT) -> str:
    """``vfops.envs._loading`` -> ``envs``; ``vfops._errors`` -> the core;
    ``vfops.__main__`` is the CLI's entry point."""
    parts = module.split(".")
    if len(parts) >= 2 and (root / parts[1]).is_dir():
        return parts[1]
    if module == "vfops.__main__":
        return "cli"
    return CORE


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_statements(
    body: list[ast.stmt], *, in_functions: bool
) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that can run: never those under ``if TYPE_CHECKING:``; those inside
    functions only when ``in_functions`` (else only what runs at import time: module-level
    ``if``/``try``/``with`` blocks and class bodies)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if in_functions:
                yield from import_statements(node.body, in_functions=True)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from import_statements(node.body, in_functions=in_functions)
            yield from import_statements(node.orelse, in_functions=in_functions)
        elif isinstance(node, ast.Try | ast.TryStar):
            for block in (node.body, node.orelse, node.finalbody):
                yield from import_statements(block, in_functions=in_functions)
            for handler in node.handlers:
                yield from import_statements(handler.body, in_functions=in_functions)
        elif isinstance(
            node, ast.ClassDef | ast.With | ast.AsyncWith | ast.For | ast.AsyncFor | ast.While
        ):
            yield from import_statements(node.body, in_functions=in_functions)
            yield from import_statements(getattr(node, "orelse", []), in_functions=in_functions)
        elif isinstance(node, ast.Match):
            for case in node.cases:
                yield from import_statements(case.body, in_functions=in_functions)


def _targets(
    module: str, is_package: bool, node: ast.Import | ast.ImportFrom, modules: Collection[str]
) -> Iterator[str]:
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
    submodules = [f"{source}.{alias.name}" for alias in node.names]
    yield from submodules  # ``from pkg import submodule`` imports the submodule
    if not all(name in modules for name in submodules):
        yield source  # a name defined in ``source`` itself (a submodule's parent package
        # is loaded first anyway: that implicit import is no arrow of the importer's)


@dataclass(frozen=True)
class Arrow:
    source: str  # module
    target: str  # module, or the first dotted name of a non-vfops import
    where: str  # path:line

    def __str__(self) -> str:
        return f"{self.where}: {self.source} -> {self.target}"


def arrows(root: Path = ROOT, *, in_functions: bool) -> list[Arrow]:
    """Every import of a vfops module by another, and every import of ``prefect`` (or of a
    top-level ``flows``: the flows' old home, outside vfops)."""
    modules = module_names(root)
    found: list[Arrow] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        where = f"{path.relative_to(root.parent)}"
        for node in import_statements(tree.body, in_functions=in_functions):
            for target in _targets(module, path.name == "__init__.py", node, modules):
                head = target.split(".")[0]
                if (target in modules and target != module) or head in ("flows", "prefect"):
                    found.append(Arrow(module, target, f"{where}:{node.lineno}"))
    return found


def import_graph(root: Path = ROOT, *, in_functions: bool = True) -> dict[str, set[str]]:
    """``module -> the vfops modules it imports`` (at import time only, or all)."""
    graph: dict[str, set[str]] = {module: set() for module in module_names(root)}
    for arrow in arrows(root, in_functions=in_functions):
        if arrow.target in graph:
            graph[arrow.source].add(arrow.target)
    return graph


def package_graph(root: Path = ROOT) -> dict[str, dict[str, list[str]]]:
    """``package -> {package it imports: [where, ...]}``, every import counted."""
    modules = module_names(root)
    graph: dict[str, dict[str, list[str]]] = {}
    for arrow in arrows(root, in_functions=True):
        if arrow.target not in modules:
            continue
        source, target = package_of(arrow.source, root), package_of(arrow.target, root)
        graph.setdefault(source, {})
        if source != target:
            graph[source].setdefault(target, []).append(arrow.where)
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


def upward_arrows(graph: dict[str, dict[str, list[str]]]) -> list[str]:
    """Each package arrow that does not go to a lower layer, with where it is made."""
    wrong = []
    for source, targets in sorted(graph.items()):
        for target, where in sorted(targets.items()):
            if layer_of(target) >= layer_of(source):
                wrong.append(f"{source} -> {target} ({', '.join(where)})")
    return wrong


def test_every_package_is_on_a_layer() -> None:
    packages = {package_of(module) for module in module_names()}
    assert {"envs", "evaluation", "cli", CORE} <= packages  # the walk saw the package
    for package in packages:
        layer_of(package)
    declared = {name for names in LAYERS for name in names}
    assert declared == packages, f"on a layer but not a package: {declared - packages}"


def test_no_arrow_runs_against_the_layers() -> None:
    """Function-local imports included: the package graph has no cycle and no arrow up
    (or sideways: packages on one layer do not import each other)."""
    graph = package_graph()
    assert graph["cli"], "the walk saw the CLI's imports"
    cycle = find_cycle({source: set(targets) for source, targets in graph.items()})
    assert cycle is None, "package cycle: " + " -> ".join(cycle or [])
    wrong = upward_arrows(graph)
    assert not wrong, "arrows against the layer order:\n" + "\n".join(wrong)


def test_vfops_modules_form_a_dag() -> None:
    """Module by module too, function-local imports included: inside a package, a lazy
    import that closes a cycle is the same tangle as one between packages."""
    graph = import_graph()
    assert "vfops.artifacts._open" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _is_flow(module: str) -> bool:
    return module.split(".")[0] == "flows" or module.startswith("vfops.flows")


def test_vfops_never_imports_flows_and_prefect_only_in_its_home() -> None:
    """Prefect lives in ``vfops.orchestration`` (and in the CLI commands that call it, and
    the flows); flow definitions are found by their entry points, never imported (the
    layers say so too: ``flows`` is on the top one, beside the CLI)."""
    found = arrows(in_functions=True)
    assert any(arrow.source.startswith("vfops.flows.") for arrow in found), "the walk saw them"
    flows = [
        str(arrow)
        for arrow in found
        if _is_flow(arrow.target) and package_of(arrow.source) != "flows"
    ]
    assert not flows, "vfops imports flows:\n" + "\n".join(flows)
    prefect = [
        str(arrow)
        for arrow in found
        if arrow.target.split(".")[0] == "prefect"
        and package_of(arrow.source) not in ("orchestration", "cli", "flows")
    ]
    assert not prefect, "Prefect imported outside vfops.orchestration:\n" + "\n".join(prefect)
    assert any(
        package_of(arrow.source) == "orchestration"
        for arrow in found
        if arrow.target.startswith("prefect")
    ), "the walk saw Prefect's home"


def readme_layers(text: str) -> tuple[tuple[str, ...], ...]:
    """The README's layer table, bottom first: the rows of the ``<!-- layers -->`` block,
    ``N. name · name    what they do`` each (the names end at the first run of spaces)."""
    block = text.split("<!-- layers -->", 1)[1].split("<!-- /layers -->", 1)[0]
    rows = re.findall(r"^\s*(\d+)\.\s+(.+?)\s*$", block, flags=re.MULTILINE)
    assert rows, "the README's layers block has no rows"
    by_number = {int(number): re.split(r"\s{2,}", rest)[0] for number, rest in rows}
    return tuple(
        tuple(
            CORE if name.strip() == "vfops/_*.py" else name.strip()
            for name in re.split(r"[,·]", by_number[number])
            if name.strip()
        )
        for number in sorted(by_number)
    )


def test_the_readme_states_the_layers() -> None:
    stated = readme_layers(README.read_text())
    assert [set(names) for names in stated] == [set(names) for names in LAYERS]


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "vfops"


def test_the_detector_names_a_module_cycle_it_is_given(tmp_path: Path) -> None:
    """A cycle through a package's __init__, a relative import and a class body."""
    root = _write(
        tmp_path,
        {
            "vfops/__init__.py": "",
            "vfops/sub/__init__.py": "from vfops.sub._a import A\n",
            "vfops/sub/_a.py": "from ._b import B\nclass A(B): ...\n",
            "vfops/sub/_b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from vfops.sub._a import A\n"
                "def later():\n    from vfops.sub import A\n"
                "class B:\n    from vfops import sub\n"
            ),
        },
    )
    cycle = find_cycle(import_graph(root, in_functions=False))
    assert cycle == ["vfops.sub", "vfops.sub._a", "vfops.sub._b", "vfops.sub"]
    # at import time, neither TYPE_CHECKING nor function-level imports are edges; counting
    # every import, the function-level one is
    (root / "sub" / "_b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from vfops.sub._a import A\n"
        "def later():\n    from vfops.sub import A\n"
        "class B: ...\n"
    )
    assert find_cycle(import_graph(root, in_functions=False)) is None
    assert find_cycle(import_graph(root)) == [
        "vfops.sub",
        "vfops.sub._a",
        "vfops.sub._b",
        "vfops.sub",
    ]
    # ``from package import submodule`` is an arrow to the submodule, not its parent
    (root / "sub" / "_b.py").write_text(
        "def later():\n    from vfops.sub import _c\nclass B: ...\n"
    )
    (root / "sub" / "_c.py").write_text("")
    assert find_cycle(import_graph(root)) is None


def test_a_function_local_import_is_a_package_arrow(tmp_path: Path) -> None:
    """The arrow the old check missed: a lazy import of a higher package, inside a
    method, inside a ``try``; a TYPE_CHECKING import is still not one."""
    root = _write(
        tmp_path,
        {
            "vfops/__init__.py": "",
            "vfops/envs/__init__.py": "",
            "vfops/evaluation/__init__.py": "from vfops.envs import x\n",
            "vfops/envs/_loading.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from vfops.cli import app\n"
                "class Loader:\n"
                "    def load(self):\n"
                "        try:\n"
                "            from vfops.evaluation import run\n"
                "        except ImportError:\n"
                "            pass\n"
            ),
        },
    )
    graph = package_graph(root)
    assert graph["envs"] == {"evaluation": ["vfops/envs/_loading.py:7"]}
    assert find_cycle({s: set(t) for s, t in graph.items()}) == ["envs", "evaluation", "envs"]
    assert upward_arrows(graph) == ["envs -> evaluation (vfops/envs/_loading.py:7)"]


def test_readme_layers_are_read_top_first() -> None:
    text = (
        "x\n<!-- layers -->\n```\n 3. cli    the commands\n 2. envs · evaluation  two, two\n"
        " 1. vfops/_*.py\n```\n<!-- /layers -->\n"
    )
    assert readme_layers(text) == ((CORE,), ("envs", "evaluation"), ("cli",))
