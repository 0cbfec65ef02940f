"""Resolve installed environments through the environment libraries (see ``_library``).

The loader knows no library by name: the libraries are the objects registered in the
entry-point group ``vfops.environment_libraries`` (vfops's own, the ``verifiers``
adapter, any third one), loaded once per process. An environment's name is asked of
each in turn, vfops's own first; the one that finds it loads it. Loading the entry
points is no import of their packages at build time, so ``vfops.envs`` depends on no
adapter: an adapter sits above it and plugs in.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import threading
from collections.abc import Iterator
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Final

from vfops._errors import EnvironmentNotFoundError, VfopsError
from vfops._examples import example_environments
from vfops.envs._environment import Environment
from vfops.envs._library import EnvironmentEntry, EnvironmentLibrary, EnvironmentPackage
from vfops.envs._load_errors import first_line
from vfops.envs._native import LIBRARY as NATIVE

LIBRARY_GROUP = "vfops.environment_libraries"

_REGISTER = f'[project.entry-points."{LIBRARY_GROUP}"]'


@functools.cache
def environment_libraries() -> tuple[EnvironmentLibrary, ...]:
    """The installed environment libraries, in the order they are asked: vfops's own
    first, then the others by name. Loaded once (``environment_libraries.cache_clear()``
    after installing a library into a running process)."""
    loaded: dict[str, EnvironmentLibrary] = {}
    for ep in sorted(entry_points(group=LIBRARY_GROUP), key=lambda ep: ep.name):
        if ep.name not in loaded:  # the same distribution found twice on sys.path
            loaded[ep.name] = _load_library(ep)
    # a source tree run without its metadata (never pip-installed) still has its own
    native = loaded.pop(NATIVE.name, NATIVE)
    return (native, *loaded.values())


def _load_library(ep: EntryPoint) -> EnvironmentLibrary:
    where = f"environment library '{ep.name}' ({ep.value}"
    if ep.dist is not None:
        where += f", from {ep.dist.name} {ep.dist.version}"
    where += ")"
    try:
        library = ep.load()
    except Exception as exc:
        raise VfopsError(
            f"{where} failed to load: {first_line(exc)}; fix or uninstall that package"
        ) from exc
    if not isinstance(library, EnvironmentLibrary):
        raise VfopsError(
            f"{where} is a {type(library).__name__}, not a vfops.envs.EnvironmentLibrary; "
            "register an instance of one"
        )
    if getattr(library, "name", None) != ep.name:
        raise VfopsError(
            f"{where} is named {getattr(library, 'name', None)!r}; name its entry point "
            f"in {_REGISTER} after the library"
        )
    return library


def environment_library(name: str) -> EnvironmentLibrary:
    """The installed library called ``name`` (an :class:`EnvironmentEntry`'s ``library``)."""
    libraries = {library.name: library for library in environment_libraries()}
    if name not in libraries:
        raise VfopsError(
            f"environment library '{name}' is not installed (installed: "
            f"{', '.join(libraries)}); install the package that registers it in {_REGISTER}"
        )
    return libraries[name]


def library_of(package: EnvironmentPackage) -> tuple[EnvironmentLibrary, dict[str, str]] | None:
    """The first library that finds environments in ``package``, and those environments
    (``{name: "module:function"}``); None when no library claims it."""
    for library in environment_libraries():
        found = library.environments(package)
        if found:
            return library, found
    return None


def installed_environments() -> dict[str, EnvironmentEntry]:
    """Installed environments by name, of every library (the first library in
    :func:`environment_libraries` wins a name two claim)."""
    found: dict[str, EnvironmentEntry] = {}
    for library in reversed(environment_libraries()):
        found.update((entry.name, entry) for entry in library.installed())
    return found


def find_environment(name: str) -> EnvironmentEntry | None:
    """The installed environment ``name`` (``-`` and ``_`` are the same), or None.

    Each library looks in its own way: vfops's own reads its entry points only, so the
    usual case reads no other package's metadata.
    """
    for library in environment_libraries():
        entry = library.find(name)
        if entry is not None:
            return entry
    return None


def environment_version(name: str) -> str | None:
    """The installed distribution version of environment ``name``, if known."""
    entry = find_environment(name)
    return entry.version if entry is not None else None


def load_environment(name: str, /, **env_args: Any) -> Environment:
    """Build the environment ``name`` with ``load_environment(**env_args)`` of its package,
    through the library it is written against (an adapter's environment comes wrapped,
    e.g. a ``verifiers`` one in :class:`vfops.adapters.VerifiersEnvironment`).

    ``name`` is positional-only: every keyword is an environment argument, one called
    ``name`` included (``-a '{"name": "x"}'`` reaches a loader that takes ``name``).
    """
    entry = require_environment(name)
    # a copy, however deep: a loader that changes what it is given (verifiers turns judge
    # entries into config objects) must not change the caller's arguments, which a run
    # records as given
    given = copy.deepcopy(env_args)
    with _rare_collections():
        return environment_library(entry.library).load(entry, **given)


def require_environment(name: str) -> EnvironmentEntry:
    """The installed environment ``name``; :class:`EnvironmentNotFoundError` (one line
    listing the installed ones) when there is none. Cheap: nothing is imported."""
    entry = find_environment(name)
    if entry is None:
        listing = ", ".join(sorted(installed_environments())) or "none"
        # an example ships inside vfops: a pip install outside a checkout has it too
        source = f"--example {name}" if name in example_environments() else "PATH"
        raise EnvironmentNotFoundError(
            f"unknown environment '{name}' (installed: {listing}); "
            f"install it with: vfops env install {source}"
        )
    return entry


class _RareCollections:
    """Young-generation collections every 20,000 allocations instead of 700 while an
    environment loads (the thresholds are the process's: the first load to start sets
    them, the last to end puts back what was there).

    Loading one is mostly imports (``verifiers`` 0.4's alone ~2.2 s of CPU here, or
    ``datasets``), and each collection the objects they create set off walks them again:
    importing ``verifiers.v1`` and its tasksets took 2.3-2.4 s instead of 2.9-3.1 s, a
    refused environment answers that much sooner and an accepted one starts that much
    sooner (bench/README.md, refusal_time.py). Collections still run, so the imports'
    garbage is freed as before (the collector off instead: the same CPU, ~20 MB more
    resident, and ~20 MB of garbage kept for good once vfops.adapters._v1 freezes what
    verifiers' import left).
    """

    THRESHOLDS: Final = (20_000, 50, 50)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loading = 0
        self._saved = gc.get_threshold()

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._loading == 0:
                self._saved = gc.get_threshold()
                gc.set_threshold(*self.THRESHOLDS)
            self._loading += 1
        try:
            yield
        finally:
            with self._lock:
                self._loading -= 1
                if self._loading == 0:
                    gc.set_threshold(*self._saved)


_rare_collections = _RareCollections()
