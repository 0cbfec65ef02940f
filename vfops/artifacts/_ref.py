"""Artifact references and the content-addressed URI layout shared by every store.

An artifact lives at ``<store root>/sha256/<first 2 hex>/<sha256>/<name>``; the URI alone
therefore names the store, the expected hash and the file name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit
from urllib.request import url2pathname

from vfops.artifacts._errors import InvalidArtifactNameError, InvalidArtifactURIError

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,254}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
HASH_DIR = "sha256"


@dataclass(frozen=True, slots=True)
class ArtifactRef:
    """A published artifact: where it is, what it hashes to, how big it is, its file name."""

    uri: str
    sha256: str
    size: int
    name: str


def check_name(name: str) -> str:
    """Return ``name`` if it is a safe single file name, else raise."""
    if not _NAME_RE.fullmatch(name) or name.endswith("."):
        raise InvalidArtifactNameError(
            f"artifact name {name!r} is not a plain file name; pass name= using only "
            "letters, digits and . _ + - (e.g. pkg-0.1.0-py3-none-any.whl)"
        )
    return name


def check_sha256(digest: str) -> str:
    """Return ``digest`` lower-cased if it is 64 hex digits, else raise."""
    lowered = digest.strip().lower()
    if not _SHA256_RE.fullmatch(lowered):
        raise InvalidArtifactURIError(
            f"expected_sha256 {digest!r} is not a sha256 hex digest; pass the 64-hex-digit "
            "sha256 from the artifact's ArtifactRef"
        )
    return lowered


def content_key(sha256: str, name: str) -> str:
    """The key of an artifact relative to its store root."""
    return f"{HASH_DIR}/{sha256[:2]}/{sha256}/{name}"


def is_content_key(key: str) -> bool:
    """Whether ``key`` (relative to a store root) is ``sha256/<ab>/<sha256>/<name>``."""
    parts = key.split("/")
    return (
        len(parts) == 4
        and parts[0] == HASH_DIR
        and _SHA256_RE.fullmatch(parts[2]) is not None
        and parts[1] == parts[2][:2]
        and _NAME_RE.fullmatch(parts[3]) is not None
    )


def redact_uri(uri: str) -> str:
    """``uri`` safe to print: any ``user:password@``, query or fragment removed."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "<unparseable URI>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@dataclass(frozen=True, slots=True)
class StoreLocation:
    """A parsed store root: ``file`` with an absolute ``path``, or ``s3`` with bucket/prefix."""

    scheme: str
    path: Path | None = None
    bucket: str = ""
    prefix: str = ""

    @property
    def uri(self) -> str:
        if self.scheme == "file":
            assert self.path is not None
            return self.path.as_uri()
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def child_uri(self, key: str) -> str:
        return f"{self.uri.rstrip('/')}/{key}"


@dataclass(frozen=True, slots=True)
class ParsedArtifactURI:
    store: StoreLocation
    sha256: str
    name: str


_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.\-_]{1,253}[a-z0-9]")


def parse_store_uri(uri: str) -> StoreLocation:
    """Parse a store root (``file:///abs/path`` or ``s3://bucket[/prefix]``)."""
    scheme, segments, location = _split(uri)
    if scheme == "file":
        return StoreLocation("file", path=Path("/", *segments))
    assert location is not None
    return StoreLocation("s3", bucket=location, prefix="/".join(segments))


def parse_artifact_uri(uri: str) -> ParsedArtifactURI:
    """Parse a content-addressed artifact URI back to its store root, hash and name."""
    scheme, segments, location = _split(uri)
    if (
        len(segments) < 4
        or segments[-4] != HASH_DIR
        or not _SHA256_RE.fullmatch(segments[-2])
        or segments[-3] != segments[-2][:2]
        or not _NAME_RE.fullmatch(segments[-1])
    ):
        raise InvalidArtifactURIError(
            f"{redact_uri(uri)} is not an artifact URI (expected "
            f"<store>/{HASH_DIR}/<ab>/<sha256>/<name>); use the uri of an ArtifactRef"
        )
    root = segments[:-4]
    if scheme == "file":
        store = StoreLocation("file", path=Path("/", *root))
    else:
        assert location is not None
        store = StoreLocation("s3", bucket=location, prefix="/".join(root))
    return ParsedArtifactURI(store, segments[-2], segments[-1])


def _split(uri: str) -> tuple[str, list[str], str | None]:
    """Validate ``uri`` and return (scheme, path segments, bucket or None)."""
    shown = redact_uri(uri)
    try:
        parts = urlsplit(uri)
    except ValueError:
        raise InvalidArtifactURIError(
            f"cannot parse artifact URI {shown}; use file:///abs/path or s3://bucket/prefix"
        ) from None
    if "@" in parts.netloc:
        raise InvalidArtifactURIError(
            f"artifact URI {shown} embeds credentials; remove them and set "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the environment instead"
        )
    if parts.query or parts.fragment:
        raise InvalidArtifactURIError(
            f"artifact URI {shown} has a query or fragment; use file:///abs/path or "
            "s3://bucket/prefix"
        )
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidArtifactURIError(
                f"file URI {shown} names host {parts.netloc!r}; use file:///abs/path "
                "(three slashes) for a local directory"
            )
        path = url2pathname(parts.path)
        if not path.startswith("/"):
            raise InvalidArtifactURIError(f"file URI {shown} is not absolute; use file:///abs/path")
        segments = [s for s in path.split("/") if s]
        _check_segments(shown, segments)
        return "file", segments, None
    if parts.scheme == "s3":
        bucket = parts.netloc
        if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
            raise InvalidArtifactURIError(
                f"S3 URI {shown} has no valid bucket name; use s3://bucket/prefix"
            )
        raw = parts.path.strip("/")  # S3 keys are used verbatim, as the AWS CLI does
        segments = raw.split("/") if raw else []
        if any(not s for s in segments):
            raise InvalidArtifactURIError(
                f"S3 URI {shown} has an empty path component (//); use s3://bucket/prefix"
            )
        _check_segments(shown, segments)
        return "s3", segments, bucket
    if not parts.scheme and uri.startswith("/"):
        raise InvalidArtifactURIError(
            f"artifact location {shown} is a bare path; use {Path(uri).as_uri()}"
        )
    raise InvalidArtifactURIError(
        f"unsupported artifact URI {shown}; use file:///abs/path or s3://bucket/prefix"
    )


def _check_segments(shown: str, segments: list[str]) -> None:
    if any(s in (".", "..") for s in segments):
        raise InvalidArtifactURIError(
            f"artifact URI {shown} contains '.' or '..'; use a normalized absolute location"
        )
