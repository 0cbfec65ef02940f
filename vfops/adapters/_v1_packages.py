"""Which packages hold a verifiers v1 taskset: the one rule ``vfops env list``, ``vfops
eval`` and ``vfops env publish`` share (through :mod:`vfops.adapters._v1_library`).

verifiers' own rule (``vf-eval <taskset-id>``) is an import: the module named like the id,
and the ``Taskset`` subclass its ``__all__`` exports. Nothing in a package's metadata has
to name verifiers (upstream's reverse_text and gsm8k declare only ``datasets``). Importing
every installed package to list them would take seconds and run their code, so vfops
decides without importing, in this order:

- a package that declares a vfops environment is vfops's own, never a taskset;
- a package that requires ``verifiers`` holds one taskset, its one module (metadata only);
- any other package holds one when its source says so: its module named like the
  distribution (``reverse-text`` -> ``reverse_text``, as verifiers turns an id into a
  module) defines ``__all__``, and that module or a module of its own package it imports
  from (followed from the top, at most :data:`MAX_SCANNED` files) imports ``verifiers``
  and names ``Taskset``.

The source is read through the package's :attr:`~vfops.envs.EnvironmentPackage.read_source`
(an installed or editable distribution, a source folder, a wheel). Loading the taskset
(an eval, publish's dataset snapshot) imports it, which confirms it in one line.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterator
from importlib.metadata import distributions

from vfops.adapters._verifiers_line import NATIVE_GROUP, module_of
from vfops.envs import EnvironmentPackage, SourceReader, installed_source, requires

NOT_TASKSETS = frozenset({"verifiers", "vfops", "prime-rl"})
"""Distributions that require or import ``verifiers`` (or provide it) but hold no taskset."""

MAX_SCANNED = 12
"""Files read per package to find its ``verifiers`` import: a taskset package reaches it
in two or three; a large library that defines ``__all__`` stops here. Measured on the v1
venv's 287 distributions: 0.14 s to list them all at 12 (0.13 s at 8), of which 0.06 s is
reading their metadata, which listing by requirements alone did too (0.075 s)."""

_IMPORTS_VERIFIERS = re.compile(
    rb"^[ \t]*(?:from[ \t]+verifiers[ \t.]|import[ \t]+verifiers\b)", re.M
)  # indented too (``try:``); run only on files that contain the word
# module-level ``from X import a, b``: the imports that run when the module is imported.
# A leading newline, not ``^`` with re.M: a literal prefix lets re skip to each candidate
# (3x faster over the v1 venv's packages, measured)
_FROM_IMPORT = re.compile(rb"\nfrom[ \t]+(\.?[\w.]*)[ \t]+import[ \t]+\(?([\w \t,]*)")


def taskset_module(package: EnvironmentPackage) -> str | None:
    """The module of ``package`` that holds a v1 taskset, by the rule above; None: none."""
    distribution = package.distribution.lower().replace("_", "-").replace(".", "-")
    if package.entry_points.get(NATIVE_GROUP) or distribution in NOT_TASKSETS:
        return None
    if package.depends_on("verifiers"):
        return module_of(package)
    module = module_named_like(distribution)
    if package.read_source is not None and imports_verifiers(package.read_source, module):
        return module
    return None


def installed_candidates() -> Iterator[EnvironmentPackage]:
    """The installed packages :func:`taskset_module` may claim, cheapest test first: each
    distribution's metadata is parsed once (name and requirements), its files are read
    only when it does not require verifiers, and only the few that pass are read whole."""
    for dist in distributions():
        metadata = dist.metadata
        needs = metadata.get_all("Requires-Dist") or ()
        name = str(metadata["Name"] or "").lower().replace("_", "-").replace(".", "-")
        if requires(needs, "verifiers") or (
            name not in NOT_TASKSETS
            and imports_verifiers(installed_source(dist), module_named_like(name))
        ):
            yield EnvironmentPackage.from_distribution(dist)


def module_named_like(name: str) -> str:
    """The module verifiers imports for a distribution or taskset id
    (``owner/Reverse-Text@1.0`` -> ``reverse_text``)."""
    return name.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


def imports_verifiers(read: SourceReader, module: str) -> bool:
    """Whether ``module``'s source, without importing it, exports names (``__all__``) and
    reaches an import of ``verifiers`` and the name ``Taskset`` through its own modules."""
    top = _entry_file(read, module)
    if top is None or not _defines_all(top[1]):
        return False
    queue = deque([top])
    seen = {top[0]}
    found_import = names_taskset = False
    for _ in range(MAX_SCANNED):
        if not queue:
            break
        path, text = queue.popleft()
        found_import = found_import or (
            b"verifiers" in text and _IMPORTS_VERIFIERS.search(text) is not None
        )
        names_taskset = names_taskset or b"Taskset" in text
        if found_import and names_taskset:
            return True
        for target in _own_imports(path, text, module):
            if target not in seen:
                seen.add(target)
                found = _read_module(read, target)
                if found is not None:
                    queue.append(found)
    return False


def _defines_all(text: bytes) -> bool:
    return text.startswith(b"__all__") or b"\n__all__" in text


def _entry_file(read: SourceReader, module: str) -> tuple[str, bytes] | None:
    for path in (f"{module}/__init__.py", f"{module}.py"):
        text = read(path)
        if text is not None:
            return path, text
    return None


def _read_module(read: SourceReader, dotted_path: str) -> tuple[str, bytes] | None:
    """``pkg/sub`` as ``pkg/sub.py`` or ``pkg/sub/__init__.py``."""
    for path in (f"{dotted_path}.py", f"{dotted_path}/__init__.py"):
        text = read(path)
        if text is not None:
            return path, text
    return None


def _own_imports(path: str, text: bytes, module: str) -> list[str]:
    """The modules of ``module``'s own package that the file at ``path`` imports from, as
    paths without a suffix (``reverse_text/taskset``)."""
    package = path.rpartition("/")[0]  # the folder of ``pkg/__init__.py`` or ``pkg/sub.py``
    targets = []
    for match in _FROM_IMPORT.finditer(b"\n" + text):
        source = match.group(1).decode("ascii", "replace")
        if source.startswith("."):  # relative to the file's own package (one level)
            if not package or source.startswith(".."):
                continue
            base, rest = package, source[1:]
        elif source == module or source.startswith(f"{module}."):
            base, rest = module, source[len(module) + 1 :]
        else:
            continue
        if rest:
            targets.append(f"{base}/{rest.replace('.', '/')}")
        else:  # ``from . import a, b``: submodules by name
            names = match.group(2).decode("ascii", "replace").split(",")
            targets.extend(f"{base}/{name.strip()}" for name in names if name.strip())
    return targets
