"""Start-up work a library does that its process does not need yet: packages whose
``__init__`` runs only when one of its own names is asked for, and entry points read once.

Some libraries vfops runs import, at their own import, a package whose ``__init__``
costs a second of CPU for one or two names (``verifiers``' Anthropic dialect takes two of
``anthropic``'s types; MLflow's gateway one of ``fastapi``'s exceptions). Registered here
before that import, the package is in ``sys.modules`` with its ``__path__``, so its
submodules are found and imported as before; a name in ``served`` comes from the
submodule that defines it (the very object the package would give); any other name, asked
for by anyone, first runs the real ``__init__`` into the same module object. A package
already imported is left alone.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Mapping
from typing import Any

__all__ = ["cache_entry_points", "on_demand"]


def cache_entry_points() -> None:
    """``importlib.metadata.entry_points`` reads every installed distribution's metadata
    at each call; from now on this process reads them once and selects from that (for a
    process that installs nothing while it runs)."""
    import importlib.metadata as metadata

    if getattr(metadata.entry_points, "_vfops_cached", False):
        return
    read = metadata.entry_points
    found: list[Any] = []  # what a call without parameters returns (3.11: SelectableGroups)

    def entry_points(**params: Any) -> Any:
        if not found:
            found.append(read())
        return found[0].select(**params)  # what entry_points(**params) does with the scan

    entry_points._vfops_cached = True  # type: ignore[attr-defined]
    metadata.entry_points = entry_points


def on_demand(name: str, served: Mapping[str, str] | None = None) -> bool:
    """Register package ``name`` on demand; ``served`` maps a name to its submodule
    (relative: ``"exceptions"``). A subpackage's parent must be imported or registered.
    False when it is imported already or not installed (nothing is changed)."""
    if name in sys.modules:
        return False
    parent_name, _, _ = name.rpartition(".")
    if parent_name:
        parent = sys.modules.get(parent_name)
        where = getattr(parent, "__path__", None)
        # found in the parent's folder: importlib.util.find_spec would run its __init__
        spec = None if where is None else importlib.machinery.PathFinder.find_spec(name, where)
    else:
        spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return False
    package = _PackageOnDemand(name)
    package.__spec__ = spec
    package.__loader__ = spec.loader
    package.__file__ = spec.origin
    package.__package__ = name
    package.__path__ = list(spec.submodule_search_locations)
    package._served = dict(served or {})
    sys.modules[name] = package
    if parent_name:
        setattr(sys.modules[parent_name], name.rpartition(".")[2], package)
    return True


class _PackageOnDemand(types.ModuleType):
    """A package whose ``__init__`` runs when a name it does not hold yet is first asked
    for; its ``__path__`` (how its submodules are found) is there from the start. A name in
    ``_served`` is taken from its own submodule without running the ``__init__``."""

    _ran = False
    _served: Mapping[str, str] = types.MappingProxyType({})
    _lock = threading.RLock()  # re-entered by the __init__'s own lookups on the package

    def __getattr__(self, name: str) -> Any:
        # any name (``__version__`` too): the import system's own (``__path__``,
        # ``__spec__``, ...) are set, so never asked for here
        with self._lock:
            if not self._ran and name in self._served:
                module = importlib.import_module(f"{self.__name__}.{self._served[name]}")
                return getattr(module, name)
            if not self._ran:
                self._ran = True
                assert self.__spec__ is not None and self.__spec__.loader is not None
                self.__spec__.loader.exec_module(self)
        if name in self.__dict__:
            return self.__dict__[name]
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
