"""Extract .tar/.tar.gz/.whl/.zip archives without letting any entry escape the destination
or fill the disk.

Size caps (defaults in :data:`DEFAULT_EXTRACT_LIMITS`, each overridable by an environment
variable) are checked twice: from the archive's headers before anything is written, and
again on the bytes actually written, because headers can lie. Everything is extracted into
a staging folder next to the destination and moved into place only once the whole archive
passed, so a refusal leaves nothing half-extracted behind.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from vfops.artifacts._errors import ArchiveLimitError, ArtifactError, UnsafeArchiveError
from vfops.artifacts._store import CHUNK_SIZE, StrPath

_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
_ZIP_SUFFIXES = (".zip", ".whl")

MiB = 1024 * 1024

_RATIO_FLOOR_BYTES = 1 * MiB
"""The compression-ratio cap applies once an archive expands past this: a few KiB of
repeated text compress 100x legitimately, a bomb is refused long before it matters."""


@dataclass(frozen=True)
class ExtractLimits:
    """Caps on what one archive may expand to (the defaults are the one definition)."""

    max_total_bytes: int = 512 * MiB
    max_entry_bytes: int = 256 * MiB
    max_entries: int = 100_000
    max_ratio: float = 100.0

    @classmethod
    def from_env(cls) -> ExtractLimits:
        """The defaults, each replaced by its ``VFOPS_EXTRACT_MAX_*`` variable when set."""
        default = cls()
        return cls(
            max_total_bytes=int(_env_number("max_total_bytes", default.max_total_bytes)),
            max_entry_bytes=int(_env_number("max_entry_bytes", default.max_entry_bytes)),
            max_entries=int(_env_number("max_entries", default.max_entries)),
            max_ratio=_env_number("max_ratio", default.max_ratio),
        )


def _env_number(field: str, default: float) -> float:
    var = EXTRACT_LIMIT_ENV_VARS[field]
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    try:
        value = float(raw) if isinstance(default, float) else int(raw)
    except ValueError:
        value = 0
    if not value > 0:
        kind = "number" if isinstance(default, float) else "whole number"
        raise ArtifactError(
            f"{var}={raw!r} is not a positive {kind}; set it to e.g. {default} or unset it"
        )
    return value


DEFAULT_EXTRACT_LIMITS = ExtractLimits()

EXTRACT_LIMIT_ENV_VARS = {
    "max_total_bytes": "VFOPS_EXTRACT_MAX_TOTAL_BYTES",
    "max_entry_bytes": "VFOPS_EXTRACT_MAX_ENTRY_BYTES",
    "max_entries": "VFOPS_EXTRACT_MAX_ENTRIES",
    "max_ratio": "VFOPS_EXTRACT_MAX_RATIO",
}


def safe_extract(archive: StrPath, dest: StrPath, *, limits: ExtractLimits | None = None) -> Path:
    """Extract ``archive`` into ``dest`` (created if needed) and return ``dest``.

    Entries with absolute paths, ``..`` components, links that resolve outside ``dest``,
    or device/FIFO entries raise :class:`UnsafeArchiveError` naming the entry; tar entries
    are additionally extracted with ``tarfile``'s ``"data"`` filter. An archive that would
    expand past ``limits`` (default: :meth:`ExtractLimits.from_env`) raises
    :class:`ArchiveLimitError` naming the limit, the value and the variable that raises it.
    On any error ``dest`` is left as it was.
    """
    archive_path = Path(archive)
    lower = archive_path.name.lower()
    if not archive_path.is_file():
        raise ArtifactError(f"archive {archive_path} does not exist; check the path")
    if not lower.endswith(_ZIP_SUFFIXES + _TAR_SUFFIXES):
        raise ArtifactError(
            f"cannot extract {archive_path.name}: unsupported archive type; "
            f"use one of {', '.join(_TAR_SUFFIXES + _ZIP_SUFFIXES)}"
        )
    guard = _Guard(archive_path, limits or ExtractLimits.from_env())
    dest_path = Path(dest)
    dest_path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest_path.parent, prefix=f".{dest_path.name}.extract-"))
    try:
        if lower.endswith(_ZIP_SUFFIXES):
            _extract_zip(archive_path, staging, guard)
        else:
            _extract_tar(archive_path, staging, guard)
        _move_into(staging, dest_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest_path


def _move_into(staging: Path, dest: Path) -> None:
    """Move the staged tree into ``dest`` (renamed whole when ``dest`` is new)."""
    if not dest.exists():
        os.chmod(staging, 0o755)  # mkdtemp makes it 0700; an extracted folder is readable
        os.replace(staging, dest)
        return
    for child in list(staging.iterdir()):
        target = dest / child.name
        if target.is_dir() and not target.is_symlink() and child.is_dir():
            _move_into(child, target)
        else:
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(child, target)


class _Guard:
    """The caps of one extraction: checked on declared sizes, then on written bytes."""

    def __init__(self, archive: Path, limits: ExtractLimits) -> None:
        self.archive = archive
        self.limits = limits
        self.archive_size = max(archive.stat().st_size, 1)
        self.entries = 0
        self.declared = 0
        self.written = 0

    def _refuse(self, what: str, value: float, field: str) -> ArchiveLimitError:
        return ArchiveLimitError(
            str(self.archive),
            what=what,
            value=value,
            limit=getattr(self.limits, field),
            env_var=EXTRACT_LIMIT_ENV_VARS[field],
        )

    def declare(self, name: str, size: int) -> None:
        """Count one entry and its header's size, before anything is written."""
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise self._refuse("number of entries", self.entries, "max_entries")
        if size > self.limits.max_entry_bytes:
            raise self._refuse(f"entry {name!r} size", size, "max_entry_bytes")
        self.declared += size
        if self.declared > self.limits.max_total_bytes:
            raise self._refuse("total uncompressed size", self.declared, "max_total_bytes")

    def check_ratio(self) -> None:
        self._ratio(self.declared)

    def _ratio(self, total: int) -> None:
        if total > _RATIO_FLOOR_BYTES and total / self.archive_size > self.limits.max_ratio:
            raise self._refuse(
                "compression ratio", round(total / self.archive_size, 1), "max_ratio"
            )

    def copy(self, name: str, declared: int, src: IO[bytes], out: IO[bytes]) -> None:
        """Copy one entry, refusing as soon as the bytes pass its header or a cap."""
        size = 0
        while chunk := src.read(CHUNK_SIZE):
            size += len(chunk)
            self.written += len(chunk)
            if size > declared:
                raise UnsafeArchiveError(
                    str(self.archive),
                    name,
                    f"holds more bytes than its header declares ({declared})",
                )
            if size > self.limits.max_entry_bytes:
                raise self._refuse(f"entry {name!r} size", size, "max_entry_bytes")
            if self.written > self.limits.max_total_bytes:
                raise self._refuse("total uncompressed size", self.written, "max_total_bytes")
            self._ratio(self.written)
            out.write(chunk)


def _check_name(archive: Path, name: str) -> PurePosixPath:
    """Reject absolute names and ``..``; return the entry's relative path."""
    posix = name.replace("\\", "/")
    if posix.startswith("/") or (len(posix) > 1 and posix[1] == ":" and posix[0].isalpha()):
        raise UnsafeArchiveError(str(archive), name, "has an absolute path")
    rel = PurePosixPath(posix)
    if ".." in rel.parts:
        raise UnsafeArchiveError(str(archive), name, "contains a '..' component")
    if "\x00" in posix:
        raise UnsafeArchiveError(str(archive), name, "contains a NUL byte")
    return rel


def _inside(root: str, path: str) -> bool:
    return os.path.commonpath([root, path]) == root


@contextlib.contextmanager
def _corrupt_is_one_line(archive: Path, kind: str) -> Iterator[None]:
    """A damaged archive (bad CRC, truncated stream) is a one-line error, not a traceback."""
    try:
        yield
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, gzip.BadGzipFile) as exc:
        if isinstance(exc, tarfile.FilterError):
            raise
        raise ArtifactError(
            f"{archive.name} is a damaged {kind} archive ({exc}); re-download or rebuild it"
        ) from None


def _extract_tar(archive: Path, root_path: Path, guard: _Guard) -> None:
    root = os.path.realpath(root_path)
    has_data_filter = hasattr(tarfile, "data_filter")
    try:
        tar = tarfile.open(archive, "r:*")  # noqa: SIM115 - closed by the with below
    except (tarfile.TarError, OSError) as exc:
        raise ArtifactError(
            f"{archive.name} is not a readable tar archive ({exc}); re-download or rebuild it"
        ) from None
    with tar, _corrupt_is_one_line(archive, "tar"):
        # Headers first: iterating reads each header and skips its data unwritten, so a
        # bomb is refused at the first header that passes a cap.
        for member in tar:
            guard.declare(member.name, member.size if member.isreg() else 0)
        guard.check_ratio()
        # One member at a time, so each check sees the links extracted before it.
        for member in tar.getmembers():
            rel = _check_name(archive, member.name)
            target = os.path.realpath(os.path.join(root, *rel.parts))
            if not _inside(root, target):
                raise UnsafeArchiveError(
                    str(archive), member.name, "resolves outside the destination"
                )
            if member.issym():
                _check_link(archive, member.name, member.linkname)
                link_target = os.path.realpath(
                    os.path.join(os.path.dirname(target), member.linkname)
                )
                if os.path.isabs(member.linkname) or not _inside(root, link_target):
                    raise UnsafeArchiveError(
                        str(archive),
                        member.name,
                        f"is a symlink to {member.linkname!r} outside the destination",
                    )
            elif member.islnk():
                _check_link(archive, member.name, member.linkname)
                link_target = os.path.realpath(os.path.join(root, member.linkname))
                if os.path.isabs(member.linkname) or not _inside(root, link_target):
                    raise UnsafeArchiveError(
                        str(archive),
                        member.name,
                        f"is a hard link to {member.linkname!r} outside the destination",
                    )
            elif not (member.isreg() or member.isdir()):
                raise UnsafeArchiveError(
                    str(archive), member.name, "is a device or FIFO, not a file or directory"
                )
            try:
                if member.isreg():
                    _write_tar_file(tar, member, root, guard, has_data_filter)
                elif has_data_filter:
                    tar.extract(member, root, filter="data")
                else:  # pragma: no cover - Python without PEP 706 backport
                    tar.extract(member, root)
            except tarfile.FilterError as exc:
                raise UnsafeArchiveError(
                    str(archive), member.name, f"was refused by tarfile ({exc})"
                ) from None


def _write_tar_file(
    tar: tarfile.TarFile, member: tarfile.TarInfo, root: str, guard: _Guard, filtered: bool
) -> None:
    """Write a regular file through the guard (tarfile's own extract would not count it)."""
    if filtered:
        checked = tarfile.data_filter(member, root)  # raises FilterError like extract would
        member = checked if checked is not None else member
    rel = _check_name(guard.archive, member.name)
    target = Path(root, *rel.parts)
    target.parent.mkdir(parents=True, exist_ok=True)
    src = tar.extractfile(member)
    if src is None:  # pragma: no cover - isreg() members always have data
        return
    with src, target.open("wb") as out:
        guard.copy(member.name, member.size, src, out)
    if member.mode is not None:
        os.chmod(target, member.mode & 0o755)


def _check_link(archive: Path, name: str, linkname: str) -> None:
    posix = linkname.replace("\\", "/")
    if posix.startswith("/") or (len(posix) > 1 and posix[1] == ":" and posix[0].isalpha()):
        raise UnsafeArchiveError(str(archive), name, f"links to the absolute path {linkname!r}")


def _extract_zip(archive: Path, root_path: Path, guard: _Guard) -> None:
    root = os.path.realpath(root_path)
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArtifactError(
            f"{archive.name} is not a readable zip archive ({exc}); re-download or rebuild it"
        ) from None
    with zf, _corrupt_is_one_line(archive, "zip"):
        infos = zf.infolist()
        for info in infos:
            guard.declare(info.filename, info.file_size)
        guard.check_ratio()
        for info in infos:
            rel = _check_name(archive, info.filename)
            target = os.path.realpath(os.path.join(root, *rel.parts))
            if not _inside(root, target):
                raise UnsafeArchiveError(
                    str(archive), info.filename, "resolves outside the destination"
                )
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                # zipfile writes link targets as plain files, but refuse escaping ones
                # so a later tool that honours the link bit cannot be tricked.
                linkname = zf.read(info).decode("utf-8", "replace")
                _check_link(archive, info.filename, linkname)
                link_target = os.path.realpath(os.path.join(os.path.dirname(target), linkname))
                if not _inside(root, link_target):
                    raise UnsafeArchiveError(
                        str(archive),
                        info.filename,
                        f"is a symlink to {linkname!r} outside the destination",
                    )
        for info in infos:
            rel = _check_name(archive, info.filename)
            target_path = Path(root, *rel.parts)
            if info.is_dir():
                target_path.mkdir(parents=True, exist_ok=True)
                continue
            target_path.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, target_path.open("wb") as out:
                guard.copy(info.filename, info.file_size, src, out)
