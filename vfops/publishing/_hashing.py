"""Content hashes of environment packages.

Two hashes, for two questions:

- ``content_hash``: sha256 over the package's source tree (every file but caches
  anywhere and build output at the package root: ``EXCLUDED_*`` below), as
  ``file:<relpath>`` + bytes in sorted order. The version string in
  ``pyproject.toml`` is left out, so "the same content" means the same code, data
  and metadata whatever the version says. It decides whether a publish is a no-op,
  a new version, or a refused overwrite.
- ``code_hash``: sha256 over the importable code (the top-level module or
  package that the environment's entry point lives in), computed the same way
  from a wheel, an installed distribution or an editable source tree. It decides
  which published version an eval ran.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from vfops._errors import VfopsError

# What the content hash leaves out (``vfops env publish --help`` says the same; keep the
# two in step). Caches and metadata that tools write, wherever they are: never content.
EXCLUDED_ANYWHERE = frozenset(
    {"__pycache__", ".git", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
)
EXCLUDED_DIR_SUFFIXES = (".egg-info",)
EXCLUDED_FILE_SUFFIXES = (".pyc", ".pyo")
# Build output, eval outputs and virtualenvs, only as folders at the package root, where
# the build backend, ``vfops eval`` and ``python -m venv`` put them: a sub-folder with one
# of these names (``sub/build/``, ``mypkg/dist/``) is the package's content.
EXCLUDED_AT_ROOT = frozenset({"build", "dist", "outputs", ".venv", "venv", ".tox", ".eggs"})
_VERSION_LINE = re.compile(rb'(?m)^version\s*=\s*["\'][^"\']*["\']\s*$')


def digest_entries(entries: Iterable[tuple[str, bytes]]) -> str:
    """sha256 over ``file:<relpath>`` + bytes, in sorted path order."""
    digest = hashlib.sha256()
    for relpath, data in sorted(entries, key=lambda entry: entry[0]):
        digest.update(f"file:{relpath}".encode())
        digest.update(hashlib.sha256(data).digest())
    return digest.hexdigest()


def iter_source_files(project_dir: Path) -> Iterator[Path]:
    """Every file the content hash covers, in sorted order (see the EXCLUDED_* sets).

    Excluded folders are pruned, not walked: a root ``.venv`` costs nothing.
    """
    files: list[Path] = []
    for folder, dirs, names in os.walk(project_dir):
        at_root = Path(folder) == project_dir
        dirs[:] = [d for d in dirs if not _excluded_dir(d, at_root=at_root)]
        files.extend(
            Path(folder, name) for name in names if not name.endswith(EXCLUDED_FILE_SUFFIXES)
        )
    for path in sorted(files):
        if path.is_file():  # a file, or a link to one; not a broken link or a socket
            yield path


def _excluded_dir(name: str, *, at_root: bool) -> bool:
    return (
        name in EXCLUDED_ANYWHERE
        or name.endswith(EXCLUDED_DIR_SUFFIXES)
        or (at_root and name in EXCLUDED_AT_ROOT)
    )


def content_hash(project_dir: Path) -> str:
    """The version-independent hash of a package's source tree."""
    entries = []
    for path in iter_source_files(project_dir):
        data = path.read_bytes()
        relpath = path.relative_to(project_dir).as_posix()
        if relpath == "pyproject.toml":
            data = _VERSION_LINE.sub(b'version = ""', data)
        entries.append((relpath, data))
    if not entries:
        raise VfopsError(f"{project_dir} has no files to publish")
    return digest_entries(entries)


def _is_code_entry(relpath: str, top_level: str) -> bool:
    parts = relpath.split("/")
    if "__pycache__" in parts or relpath.endswith((".pyc", ".pyo")):
        return False
    return parts[0] == top_level or relpath in (f"{top_level}.py",)


def wheel_code_hash(wheel: Path, top_level: str) -> str:
    """code_hash of the module/package ``top_level`` inside a built wheel."""
    with zipfile.ZipFile(wheel) as archive:
        entries = [
            (name, archive.read(name))
            for name in archive.namelist()
            if not name.endswith("/") and _is_code_entry(name, top_level)
        ]
    if not entries:
        raise VfopsError(f"{wheel.name} contains no module named '{top_level}'")
    return digest_entries(entries)


def installed_code_hash(top_level: str) -> str:
    """code_hash of the importable module/package ``top_level`` as installed here."""
    spec = importlib.util.find_spec(top_level)
    if spec is None or spec.origin is None:
        raise VfopsError(f"module '{top_level}' is not importable; install the environment")
    origin = Path(spec.origin)
    if spec.submodule_search_locations:  # a package: every file under its folder
        root = origin.parent
        entries = [
            (f"{top_level}/{path.relative_to(root).as_posix()}", path.read_bytes())
            for path in sorted(root.rglob("*"))
            if path.is_file()
            and _is_code_entry(f"{top_level}/{path.relative_to(root).as_posix()}", top_level)
        ]
    else:
        entries = [(f"{top_level}.py", origin.read_bytes())]
    return digest_entries(entries)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
