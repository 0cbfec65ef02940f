"""The :class:`ArtifactStore` interface and the get/verify logic its stores share.

Store selection (:func:`open_store`) lives in ``_open``: it imports the concrete stores,
which import this module.
"""

from __future__ import annotations

import abc
import contextlib
import datetime as dt
import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, BinaryIO

from vfops.artifacts._errors import (
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    InvalidArtifactURIError,
)
from vfops.artifacts._ref import (
    ArtifactRef,
    StoreLocation,
    check_name,
    check_sha256,
    content_key,
    parse_artifact_uri,
    redact_uri,
)

log = logging.getLogger("vfops.artifacts")

CHUNK_SIZE = 1024 * 1024
DEFAULT_MULTIPART_THRESHOLD = 8 * 1024 * 1024
FILE_MODE = 0o644
DEFAULT_GC_GRACE_HOURS = 24.0
"""Unreferenced objects younger than this are kept by a sweep: they may belong to a
publish that has uploaded but not yet written its registry row."""

StrPath = str | os.PathLike[str]


def sha256_stream(stream: IO[bytes]) -> tuple[str, int]:
    """Hash ``stream`` from its current position to the end, in chunks."""
    digest = hashlib.sha256()
    size = 0
    while chunk := stream.read(CHUNK_SIZE):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def copy_and_hash(src: IO[bytes], dst: IO[bytes]) -> tuple[str, int]:
    """Copy ``src`` to ``dst`` in chunks, returning the sha256 and size of what was copied."""
    digest = hashlib.sha256()
    size = 0
    while chunk := src.read(CHUNK_SIZE):
        digest.update(chunk)
        dst.write(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def open_source(path: StrPath) -> BinaryIO:
    """Open a file to publish, turning a missing or non-regular file into a user error."""
    p = Path(path)
    if not p.is_file():
        raise ArtifactNotFoundError(
            f"cannot publish {p}: it does not exist or is not a regular file; check the path"
        )
    return p.open("rb")


@dataclass(frozen=True, slots=True)
class StoredObject:
    """An object found in a store by :meth:`ArtifactStore.iter_objects`."""

    uri: str
    sha256: str
    name: str
    size: int
    modified: dt.datetime
    """When the bytes were last written (UTC)."""


class ArtifactStore(abc.ABC):
    """A content-addressed store of immutable files.

    Every artifact lives at ``<root>/sha256/<ab>/<sha256>/<name>``; putting the same bytes
    under the same name twice is a no-op, and every download is verified against its sha256.
    """

    def __init__(self, location: StoreLocation) -> None:
        self._location = location

    @property
    def uri(self) -> str:
        """The store root, e.g. ``file:///srv/artifacts`` or ``s3://bucket/prefix``."""
        return self._location.uri

    def uri_for(self, sha256: str, name: str) -> str:
        """The URI an artifact with this hash and name has (or would have) in this store."""
        return self._location.child_uri(content_key(check_sha256(sha256), check_name(name)))

    # -- publishing -------------------------------------------------------------------

    def put_file(self, path: StrPath, name: str | None = None) -> ArtifactRef:
        """Publish a local file (streamed) under ``name`` (default: the file's name)."""
        return self.put_file_tracked(path, name)[0]

    @abc.abstractmethod
    def put_file_tracked(self, path: StrPath, name: str | None = None) -> tuple[ArtifactRef, bool]:
        """Like :meth:`put_file`; also whether this call wrote the object (False: it was
        already there, and its write time is refreshed so a concurrent ``gc`` keeps it)."""

    @abc.abstractmethod
    def put_bytes(self, data: bytes, name: str) -> ArtifactRef:
        """Publish in-memory bytes under ``name``."""

    # -- housekeeping -----------------------------------------------------------------

    @abc.abstractmethod
    def iter_objects(self) -> Iterator[StoredObject]:
        """Every artifact under this store's ``sha256/`` layout (other keys are skipped)."""

    @abc.abstractmethod
    def delete(self, ref: ArtifactRef | str) -> bool:
        """Remove an artifact; True if it was there."""

    # -- reading ----------------------------------------------------------------------

    def exists(self, ref: ArtifactRef | str) -> bool:
        """Whether the artifact is present in this store."""
        return self._stat(self._key_of(ref)) is not None

    def get_file(
        self,
        ref: ArtifactRef | str,
        dest: StrPath,
        expected_sha256: str | None = None,
    ) -> Path:
        """Download an artifact to ``dest``: a file path, or a directory (existing, or
        ending in ``/``) to download into under the artifact's name.

        The bytes are streamed to a temporary file next to ``dest``, hashed, and renamed
        into place only if the sha256 matches ``expected_sha256`` (default: the hash in the
        reference/URI). On a mismatch the temporary file is deleted and
        :class:`ArtifactIntegrityError` is raised; ``dest`` is never left half-written.
        """
        uri = ref.uri if isinstance(ref, ArtifactRef) else ref
        parsed = parse_artifact_uri(uri)
        self._check_owned(uri, parsed.store)
        if expected_sha256 is not None:
            expected = check_sha256(expected_sha256)
        elif isinstance(ref, ArtifactRef):
            expected = check_sha256(ref.sha256)
        else:
            expected = parsed.sha256
        key = content_key(parsed.sha256, parsed.name)
        target = Path(dest)
        if target.is_dir() or os.fspath(dest).endswith(("/", os.sep)):
            target = target / parsed.name
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(
            dir=target.parent, prefix=f".{target.name}.", suffix=".part"
        )
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "w+b") as out:
                actual = self._download(key, out)
                out.flush()
                if actual is None:
                    out.seek(0)
                    actual, _ = sha256_stream(out)
                os.fchmod(out.fileno(), FILE_MODE)
                os.fsync(out.fileno())
            if actual != expected:
                raise ArtifactIntegrityError(redact_uri(uri), expected=expected, actual=actual)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        log.debug("downloaded %s to %s", uri, target)
        return target

    # -- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        """Release network connections (a no-op for local stores)."""
        return None

    def __enter__(self) -> ArtifactStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"

    # -- for subclasses ---------------------------------------------------------------

    @abc.abstractmethod
    def _stat(self, key: str) -> int | None:
        """The size of the object at ``key`` (relative to the root), or None if absent."""

    @abc.abstractmethod
    def _download(self, key: str, out: BinaryIO) -> str | None:
        """Write the object's bytes to ``out``; return their sha256 if computed on the way.

        Raise :class:`ArtifactNotFoundError` if there is no such object.
        """

    def _key_of(self, ref: ArtifactRef | str) -> str:
        uri = ref.uri if isinstance(ref, ArtifactRef) else ref
        parsed = parse_artifact_uri(uri)
        self._check_owned(uri, parsed.store)
        return content_key(parsed.sha256, parsed.name)

    def _check_owned(self, uri: str, store: StoreLocation) -> None:
        if store != self._location:
            raise InvalidArtifactURIError(
                f"artifact {redact_uri(uri)} is not in store {self.uri}; "
                "open its own store with vfops.artifacts.open_uri(uri)"
            )

    def _not_found(self, key: str) -> ArtifactNotFoundError:
        return ArtifactNotFoundError(
            f"artifact {self._location.child_uri(key)} does not exist; "
            "check the URI or publish the artifact again"
        )

    def _ref(self, sha256: str, size: int, name: str) -> ArtifactRef:
        return ArtifactRef(
            uri=self._location.child_uri(content_key(sha256, name)),
            sha256=sha256,
            size=size,
            name=name,
        )
