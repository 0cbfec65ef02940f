"""Store selection: the concrete store for a URI."""

from __future__ import annotations

from vfops._settings import artifacts_uri
from vfops.artifacts._local import LocalArtifactStore
from vfops.artifacts._ref import StoreLocation, parse_artifact_uri, parse_store_uri
from vfops.artifacts._s3 import S3ArtifactStore
from vfops.artifacts._store import DEFAULT_MULTIPART_THRESHOLD, ArtifactStore


def open_store(
    uri: str | None = None, *, multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD
) -> ArtifactStore:
    """Open the store at ``uri`` (default: ``VFOPS_ARTIFACTS`` / ``$VFOPS_HOME/artifacts``).

    ``file:///abs/path`` gives a :class:`LocalArtifactStore`; ``s3://bucket/prefix`` an
    :class:`S3ArtifactStore` (``multipart_threshold`` applies to S3 uploads only).
    """
    location = parse_store_uri(artifacts_uri() if uri is None else uri)
    return _open_location(location, multipart_threshold=multipart_threshold)


def open_uri(uri: str, *, multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD) -> ArtifactStore:
    """Open the store that holds the artifact at ``uri`` (an ``ArtifactRef.uri``)."""
    return _open_location(parse_artifact_uri(uri).store, multipart_threshold=multipart_threshold)


def _open_location(location: StoreLocation, *, multipart_threshold: int) -> ArtifactStore:
    if location.scheme == "file":
        return LocalArtifactStore(location.uri)
    return S3ArtifactStore(location.uri, multipart_threshold=multipart_threshold)
