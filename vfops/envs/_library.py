"""Environment libraries: how vfops finds, loads and describes environments written
against a library — its own, ``verifiers``, or any third one — without knowing which.

An environment package is written against one library: vfops's own (``vfops.envs``),
``verifiers`` (run by :mod:`vfops.adapters`), or another. The loader, publishing and
``vfops env list`` ask the libraries, never test a library's name, so adding one is
a module and an entry point, with no edit to vfops. A library is an
:class:`EnvironmentLibrary` object registered in the entry-point group
``vfops.environment_libraries`` (discovered the way pytest finds its plugins),
named like the library::

    [project.entry-points."vfops.environment_libraries"]
    toylib = "toylib_vfops:LIBRARY"

It answers three questions, and only :meth:`~EnvironmentLibrary.environments` and
:meth:`~EnvironmentLibrary.build` have no default:

- **find** — :meth:`~EnvironmentLibrary.environments`: which of its environments a
  package holds (``{name: "module:function"}``), read from what the package says about
  itself (:class:`EnvironmentPackage`: an installed distribution, a source folder's
  ``pyproject.toml`` at publish, a wheel at install). :meth:`~EnvironmentLibrary.installed`
  and :meth:`~EnvironmentLibrary.find` list and look up installed ones; their defaults
  read every installed distribution (~0.2 s), so a library with a cheaper index
  overrides them (vfops's own reads its ``vfops.environments`` entry points only).
- **load** — :meth:`~EnvironmentLibrary.build`: a package's ``load_environment`` and
  its arguments made into a vfops :class:`~vfops.envs.Environment` (an adapter wraps
  its library's object in one); :meth:`~EnvironmentLibrary.load` imports an installed
  environment's function and builds it (override it to load the library's own way).
- **describe** — :attr:`~EnvironmentLibrary.name` (``vfops env list``'s ``library``
  column, a run's provenance) and :meth:`~EnvironmentLibrary.version`: recorded with
  every run of its environments (``toylib==0.2.0``, a tag and part of the run's
  identity, since the library decides what runs); None for vfops's own.

Libraries are asked in order: vfops's own first (an environment a package declares in
``vfops.environments`` wins a name another library infers), then the others by name;
they are loaded once per process (``environment_libraries.cache_clear()`` after
installing one into a running process). A library's module is imported whenever an
environment is looked up, so it must import lightly: the library itself (which may
take seconds, as ``verifiers`` does) only in ``build`` and ``load``.
"""

from __future__ import annotations

import abc
import importlib
import importlib.util
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from importlib.metadata import Distribution, PackageNotFoundError, distributions
from typing import Any

from vfops.envs._environment import Environment
from vfops.envs._load_errors import load_failure

DEFAULT_FACTORY = "load_environment"
"""The function an environment package exposes, by every library's convention so far."""

_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")

SourceReader = Callable[[str], "bytes | None"]
"""Reads one of a package's importable files by its path below the import root
(``pkg/__init__.py``, ``pkg/sub.py``, ``mod.py``), without importing anything; None when
the package has no such file. A library that decides from a package's source whether it
holds its environments (verifiers v1's does: its packages need not declare verifiers)
reads it through this, wherever the package is: installed, a source folder, a wheel."""


@dataclass(frozen=True)
class EnvironmentEntry:
    """An installed environment: its name, where its ``load_environment`` lives (``attr``
    empty: the module is what the library loads), the library it is written against and
    the distribution that installed it."""

    name: str
    module: str
    attr: str
    library: str
    dist: Distribution | None

    def load(self) -> Any:
        """Import the module and return its ``load_environment`` (the module itself when
        ``attr`` is empty: a library that reads the module, as verifiers v1's does)."""
        module = importlib.import_module(self.module)
        return getattr(module, self.attr) if self.attr else module

    @property
    def version(self) -> str | None:
        return self.dist.version if self.dist is not None else None


@dataclass(frozen=True)
class EnvironmentPackage:
    """What a package says about itself, wherever it is read from: an installed
    distribution, a source folder's ``pyproject.toml`` or a wheel's metadata."""

    distribution: str
    """Its distribution name (an installed one's lowercased, ``-`` for ``_`` and ``.``)."""
    requires: tuple[str, ...] = ()
    """Its requirements, as PEP 508 strings (``verifiers>=0.3; extra == "x"``)."""
    entry_points: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Its entry points: group -> name -> ``module:function``."""
    modules: tuple[str, ...] = ()
    """The top-level modules it installs, where known (empty: not known)."""
    dist: Distribution | None = None
    """The installed distribution it was read from (None: a source folder or a wheel)."""
    read_source: SourceReader | None = field(default=None, compare=False, repr=False)
    """Reads its source files (None: not at hand)."""

    @classmethod
    def from_distribution(cls, dist: Distribution) -> EnvironmentPackage:
        listed = (dist.read_text("top_level.txt") or "").splitlines()
        groups: dict[str, dict[str, str]] = {}
        for ep in dist.entry_points:
            groups.setdefault(ep.group, {})[ep.name] = ep.value
        return cls(
            distribution=distribution_name(dist),
            requires=tuple(dist.requires or ()),
            entry_points=groups,
            modules=tuple(m.strip() for m in listed if m.strip() and not m.startswith("_")),
            dist=dist,
            read_source=installed_source(dist),
        )

    def depends_on(self, name: str) -> bool:
        """Whether the package requires ``name`` unconditionally (not only for an extra)."""
        return requires(self.requires, name)


def installed_source(dist: Distribution) -> SourceReader:
    """Reads the files of an installed distribution: where it installed them, else
    (an editable install, whose files stay in its project folder) where the import
    system finds its top-level module, as ``import`` would."""
    installed_root = str(dist.locate_file(""))

    @cache
    def spec_roots(top: str) -> tuple[str, ...]:
        try:
            spec = importlib.util.find_spec(top)  # a top-level name: imports nothing
        except (ImportError, ValueError):
            return ()
        if spec is None:
            return ()
        if spec.submodule_search_locations is not None:  # a package: its folders' parent
            return tuple(os.path.dirname(folder) for folder in spec.submodule_search_locations)
        return (os.path.dirname(spec.origin),) if spec.origin else ()

    def read(relpath: str) -> bytes | None:
        top = relpath.split("/", 1)[0].removesuffix(".py")
        for root in (installed_root, *spec_roots(top)):
            try:
                with open(os.path.join(root, relpath), "rb") as file:
                    return file.read()
            except OSError:  # not there (or not a file): the next place
                continue
        return None

    return read


def requires(requirements: Iterable[str], name: str) -> bool:
    """Whether ``requirements`` (PEP 508 strings) name ``name`` outside an extra."""
    wanted = name.lower().replace("_", "-")
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        if "extra" in marker:  # an optional dependency does not make it an environment
            continue
        match = _REQUIREMENT_NAME.match(spec)
        if match and match.group(1).lower().replace("_", "-") == wanted:
            return True
    return False


def distribution_name(dist: Distribution) -> str:
    """``dist``'s name, lowercased, with ``-`` for ``_`` and ``.``."""
    return str(dist.metadata["Name"] or "").strip().lower().replace("_", "-").replace(".", "-")


class EnvironmentLibrary(abc.ABC):
    """A library environments are written against; see the module docstring.

    Subclass it, set :attr:`name`, implement :meth:`environments` and :meth:`build`,
    and register an instance in the ``vfops.environment_libraries`` entry-point group.
    """

    name: str
    """The library's name: its entry point's name, and (by default) its distribution's."""

    @abc.abstractmethod
    def environments(self, package: EnvironmentPackage) -> dict[str, str]:
        """The environments of this library ``package`` holds, ``{name: "module:function"}``
        (empty: none, or not a package of this library)."""

    @abc.abstractmethod
    def build(self, factory: Callable[..., Any], name: str, /, **env_args: Any) -> Environment:
        """``factory(**env_args)`` (a package's ``load_environment``) as a vfops environment
        called ``name``; a failure is a one-line :class:`~vfops.VfopsError` (see
        :func:`~vfops.envs.load_failure`). ``factory`` and ``name`` are positional-only:
        every keyword is an environment argument."""

    def load(self, entry: EnvironmentEntry, /, **env_args: Any) -> Environment:
        """The installed environment ``entry`` built with ``env_args``."""
        try:
            factory = entry.load()
        except Exception as exc:
            raise load_failure(
                f"environment '{entry.name}' failed to import:",
                exc,
                otherwise="fix the package or reinstall it with: vfops env install PATH",
            ) from exc
        return self.build(factory, entry.name, **env_args)

    def installed(self) -> list[EnvironmentEntry]:
        """Every installed environment of this library (default: read every distribution)."""
        return [
            entry
            for dist in distributions()
            for entry in self.entries(EnvironmentPackage.from_distribution(dist))
        ]

    def find(self, name: str) -> EnvironmentEntry | None:
        """The installed environment ``name`` (``-`` and ``_`` are the same), or None."""
        found = {entry.name: entry for entry in self.installed()}
        return found.get(name) or found.get(name.replace("-", "_"))

    def version(self) -> str | None:
        """The library's installed version, recorded with each run of its environments
        (default: the version of the distribution named like it; None if none is)."""
        try:
            return metadata.version(self.name)
        except PackageNotFoundError:
            return None

    def entries(self, package: EnvironmentPackage) -> list[EnvironmentEntry]:
        """:meth:`environments` of the installed ``package`` as entries."""
        found = []
        for env_name, target in self.environments(package).items():
            module, _, attr = target.partition(":")
            found.append(
                EnvironmentEntry(
                    env_name,
                    module.strip(),
                    attr.split("[", 1)[0].strip() or DEFAULT_FACTORY,
                    self.name,
                    package.dist,
                )
            )
        return found

    def __repr__(self) -> str:
        return f"<environment library {self.name!r}>"
