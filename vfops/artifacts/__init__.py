"""Content-addressed artifact storage (local directories and S3) and safe archive extraction.

>>> store = open_store()                      # VFOPS_ARTIFACTS, default $VFOPS_HOME/artifacts
>>> ref = store.put_file("dist/pkg-0.1.0-py3-none-any.whl")
>>> open_uri(ref.uri).get_file(ref, "/tmp/wheels/")   # verified against ref.sha256
"""

from vfops.artifacts._errors import (
    ArchiveLimitError,
    ArtifactError,
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    ArtifactStoreError,
    InvalidArtifactNameError,
    InvalidArtifactURIError,
    UnsafeArchiveError,
)
from vfops.artifacts._extract import (
    DEFAULT_EXTRACT_LIMITS,
    EXTRACT_LIMIT_ENV_VARS,
    ExtractLimits,
    safe_extract,
)
from vfops.artifacts._local import LocalArtifactStore
from vfops.artifacts._open import open_store, open_uri
from vfops.artifacts._ref import ArtifactRef, parse_artifact_uri
from vfops.artifacts._s3 import S3ArtifactStore
from vfops.artifacts._store import (
    DEFAULT_GC_GRACE_HOURS,
    DEFAULT_MULTIPART_THRESHOLD,
    ArtifactStore,
    StoredObject,
)

__all__ = [
    "DEFAULT_EXTRACT_LIMITS",
    "DEFAULT_GC_GRACE_HOURS",
    "DEFAULT_MULTIPART_THRESHOLD",
    "EXTRACT_LIMIT_ENV_VARS",
    "ArchiveLimitError",
    "ArtifactError",
    "ArtifactIntegrityError",
    "ArtifactNotFoundError",
    "ArtifactRef",
    "ArtifactStore",
    "ArtifactStoreError",
    "ExtractLimits",
    "InvalidArtifactNameError",
    "InvalidArtifactURIError",
    "LocalArtifactStore",
    "S3ArtifactStore",
    "StoredObject",
    "UnsafeArchiveError",
    "open_store",
    "open_uri",
    "parse_artifact_uri",
    "safe_extract",
]
