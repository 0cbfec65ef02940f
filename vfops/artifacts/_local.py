"""A content-addressed artifact store in a local (or network-mounted) directory."""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from pathlib import Path
from typing import IO, BinaryIO

from vfops.artifacts._errors import InvalidArtifactURIError
from vfops.artifacts._ref import ArtifactRef, check_name, content_key, parse_store_uri
from vfops.artifacts._store import (
    FILE_MODE,
    ArtifactStore,
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

    def put_file(self, path: StrPath, name: str | None = None) -> ArtifactRef:
        name = check_name(Path(path).name if name is None else name)
        with open_source(path) as src:
            return self._put_stream(src, name)

    def put_bytes(self, data: bytes, name: str) -> ArtifactRef:
        return self._put_stream(io.BytesIO(data), check_name(name))

    def _put_stream(self, src: IO[bytes], name: str) -> ArtifactRef:
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
            if self._stat_path(final) == size:
                log.debug("artifact %s already present; skipped", final)
                tmp.unlink()
            else:
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, final)
                log.debug("stored %s (%d bytes)", final, size)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        return self._ref(sha256, size, name)

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
