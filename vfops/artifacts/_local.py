"""A content-addressed artifact store in a local (or network-mounted) directory."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, BinaryIO

from vfops.artifacts._errors import InvalidArtifactURIError
from vfops.artifacts._ref import (
    HASH_DIR,
    ArtifactRef,
    check_name,
    content_key,
    is_content_key,
    parse_store_uri,
)
from vfops.artifacts._store import (
    FILE_MODE,
    ArtifactStore,
    StoredObject,
    StrPath,
    copy_and_hash,
    log,
    open_source,
)

_TMP_DIR = ".tmp"


class LocalArtifactStore(ArtifactStore):
    """Artifacts under a directory given as ``file:///abs/path``.

    Writes go to ``<root>/.tmp/`` first and are renamed into place atomically, so readers
    never see a partial artifact and concurrent writers of the same bytes are harmless.
    """

    def __init__(self, uri: str) -> None:
        location = parse_store_uri(uri)
        if location.scheme != "file" or location.path is None:
            raise InvalidArtifactURIError(
                f"LocalArtifactStore needs a file:///abs/path URI, not {location.uri}; "
                "use vfops.artifacts.open_store(uri)"
            )
        super().__init__(location)
        self.root: Path = location.path

    def put_file_tracked(self, path: StrPath, name: str | None = None) -> tuple[ArtifactRef, bool]:
        name = check_name(Path(path).name if name is None else name)
        with open_source(path) as src:
            return self._put_stream(src, name)

    def put_bytes(self, data: bytes, name: str) -> ArtifactRef:
        return self._put_stream(io.BytesIO(data), check_name(name))[0]

    def _put_stream(self, src: IO[bytes], name: str) -> tuple[ArtifactRef, bool]:
        tmp_dir = self.root / _TMP_DIR
        tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=tmp_dir, prefix=f"{name}.", suffix=".part")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out:
                sha256, size = copy_and_hash(src, out)
                out.flush()
                os.fchmod(out.fileno(), FILE_MODE)
                os.fsync(out.fileno())
            final = self.root / content_key(sha256, name)
            created = self._stat_path(final) != size
            if not created:
                log.debug("artifact %s already present; skipped", final)
                tmp.unlink()
                with contextlib.suppress(FileNotFoundError):
                    os.utime(final)  # a fresh write time: gc's grace period counts from now
            else:
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, final)
                log.debug("stored %s (%d bytes)", final, size)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        return self._ref(sha256, size, name), created

    def iter_objects(self) -> Iterator[StoredObject]:
        base = self.root / HASH_DIR
        if not base.is_dir():
            return
        for path in sorted(base.glob("*/*/*")):
            key = path.relative_to(self.root).as_posix()
            if not is_content_key(key):
                continue
            try:
                st = path.stat()
            except FileNotFoundError:  # removed since the listing
                continue
            yield StoredObject(
                uri=self._location.child_uri(key),
                sha256=path.parent.name,
                name=path.name,
                size=st.st_size,
                modified=dt.datetime.fromtimestamp(st.st_mtime, dt.UTC),
            )

    def delete(self, ref: ArtifactRef | str) -> bool:
        path = self.root / self._key_of(ref)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        # Drop the now-empty <sha256>/ and <ab>/ folders (another writer may refill them).
        for folder in (path.parent, path.parent.parent):
            with contextlib.suppress(OSError):
                folder.rmdir()
        return True

    def _stat(self, key: str) -> int | None:
        return self._stat_path(self.root / key)

    @staticmethod
    def _stat_path(path: Path) -> int | None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return st.st_size

    def _download(self, key: str, out: BinaryIO) -> str | None:
        try:
            src = (self.root / key).open("rb")
        except FileNotFoundError:
            raise self._not_found(key) from None
        with src:
            sha256, _ = copy_and_hash(src, out)
        return sha256
