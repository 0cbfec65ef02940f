"""Errors raised by the artifact store; each message is one line naming the problem and the fix."""

from __future__ import annotations

from vfops._errors import VfopsError


class ArtifactError(VfopsError):
    """Base class for artifact-store errors."""


class InvalidArtifactURIError(ArtifactError):
    """An artifact or store URI that vfops cannot parse or does not own."""


class InvalidArtifactNameError(ArtifactError):
    """An artifact name that is not a single safe file name."""


class ArtifactNotFoundError(ArtifactError):
    """The artifact, or the file to publish, does not exist."""


class ArtifactStoreError(ArtifactError):
    """The store could not be reached or refused the request (credentials, bucket, network)."""


class ArtifactIntegrityError(ArtifactError):
    """The downloaded bytes do not hash to the expected sha256."""

    def __init__(self, uri: str, *, expected: str, actual: str) -> None:
        self.uri = uri
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"artifact {uri} is corrupted: sha256 is {actual}, expected {expected}; re-publish it"
        )


class UnsafeArchiveError(ArtifactError):
    """An archive entry would be written outside the destination directory."""

    def __init__(self, archive: str, entry: str, reason: str) -> None:
        self.archive = archive
        self.entry = entry
        self.reason = reason
        super().__init__(
            f"refusing to extract {archive}: entry {entry!r} {reason}; "
            "rebuild the archive with relative paths inside one directory"
        )


class ArchiveLimitError(ArtifactError):
    """An archive would expand past a size, count or compression-ratio cap."""

    def __init__(
        self, archive: str, *, what: str, value: float, limit: float, env_var: str
    ) -> None:
        self.archive = archive
        self.what = what
        self.value = value
        self.limit = limit
        self.env_var = env_var
        super().__init__(
            f"refusing to extract {archive}: {what} {_number(value)} is above the limit "
            f"{_number(limit)}; if the archive is trusted, raise it with {env_var}"
        )


def _number(value: float) -> str:
    """``2097152`` for whole numbers (byte counts stay exact), ``1234.5`` otherwise."""
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"
