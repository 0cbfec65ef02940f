"""Extract .tar/.tar.gz/.whl/.zip archives without letting any entry escape the destination."""

from __future__ import annotations

import os
import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

from vfops.artifacts._errors import ArtifactError, UnsafeArchiveError
from vfops.artifacts._store import StrPath

_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
_ZIP_SUFFIXES = (".zip", ".whl")


def safe_extract(archive: StrPath, dest: StrPath) -> Path:
    """Extract ``archive`` into ``dest`` (created if needed) and return ``dest``.

    Entries with absolute paths, ``..`` components, links that resolve outside ``dest``,
    or device/FIFO entries raise :class:`UnsafeArchiveError` naming the entry; tar entries
    are additionally extracted with ``tarfile``'s ``"data"`` filter.
    """
    archive_path = Path(archive)
    lower = archive_path.name.lower()
    if not archive_path.is_file():
        raise ArtifactError(f"archive {archive_path} does not exist; check the path")
    dest_path = Path(dest)
    dest_path.mkdir(parents=True, exist_ok=True)
    if lower.endswith(_ZIP_SUFFIXES):
        _extract_zip(archive_path, dest_path)
    elif lower.endswith(_TAR_SUFFIXES):
        _extract_tar(archive_path, dest_path)
    else:
        raise ArtifactError(
            f"cannot extract {archive_path.name}: unsupported archive type; "
            f"use one of {', '.join(_TAR_SUFFIXES + _ZIP_SUFFIXES)}"
        )
    return dest_path


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


def _extract_tar(archive: Path, dest: Path) -> None:
    root = os.path.realpath(dest)
    has_data_filter = hasattr(tarfile, "data_filter")
    try:
        tar = tarfile.open(archive, "r:*")  # noqa: SIM115 - closed by the with below
    except (tarfile.TarError, OSError) as exc:
        raise ArtifactError(
            f"{archive.name} is not a readable tar archive ({exc}); re-download or rebuild it"
        ) from None
    with tar:
        # One member at a time, so each check sees the links extracted before it.
        for member in tar:
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
                if has_data_filter:
                    tar.extract(member, root, filter="data")
                else:  # pragma: no cover - Python without PEP 706 backport
                    tar.extract(member, root)
            except tarfile.FilterError as exc:
                raise UnsafeArchiveError(
                    str(archive), member.name, f"was refused by tarfile ({exc})"
                ) from None


def _check_link(archive: Path, name: str, linkname: str) -> None:
    posix = linkname.replace("\\", "/")
    if posix.startswith("/") or (len(posix) > 1 and posix[1] == ":" and posix[0].isalpha()):
        raise UnsafeArchiveError(str(archive), name, f"links to the absolute path {linkname!r}")


def _extract_zip(archive: Path, dest: Path) -> None:
    root = os.path.realpath(dest)
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArtifactError(
            f"{archive.name} is not a readable zip archive ({exc}); re-download or rebuild it"
        ) from None
    with zf:
        infos = zf.infolist()
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
            zf.extract(info, root)
