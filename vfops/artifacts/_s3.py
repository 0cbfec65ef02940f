"""A content-addressed artifact store in an S3 bucket (AWS, MinIO, moto).

boto3 is imported only when a store first talks to S3. Credentials come from boto3's
default chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, instance
roles); vfops never reads, stores or prints them. ``VFOPS_S3_ENDPOINT_URL`` points the client
at an S3-compatible server.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import io
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from vfops._errors import InvalidArgumentError
from vfops._settings import s3_endpoint_url
from vfops.artifacts._errors import (
    ArtifactError,
    ArtifactNotFoundError,
    ArtifactStoreError,
    InvalidArtifactURIError,
)
from vfops.artifacts._ref import (
    HASH_DIR,
    ArtifactRef,
    check_name,
    content_key,
    is_content_key,
    parse_store_uri,
    redact_uri,
)
from vfops.artifacts._store import (
    DEFAULT_MULTIPART_THRESHOLD,
    ArtifactStore,
    StoredObject,
    StrPath,
    log,
    open_source,
    sha256_stream,
)

if TYPE_CHECKING:
    from boto3.s3.transfer import TransferConfig
    from mypy_boto3_s3 import S3Client

_MIN_PART_SIZE = 5 * 1024 * 1024
"""S3's smallest non-final multipart part; s3transfer raises smaller chunk sizes to this."""

_SHA256_METADATA = "sha256"

_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
_DENIED_CODES = frozenset(
    {
        "403",
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "AllAccessDisabled",
    }
)


class S3ArtifactStore(ArtifactStore):
    """Artifacts under ``s3://bucket/prefix``.

    Files of at least ``multipart_threshold`` bytes are uploaded in parts of
    ``multipart_chunksize`` bytes (default: the threshold; at least 5 MiB, S3's minimum
    part size) on ``max_concurrency`` threads; downloads use ranged GETs the same way.
    """

    def __init__(
        self,
        uri: str,
        *,
        endpoint_url: str | None = None,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        multipart_chunksize: int | None = None,
        max_concurrency: int = 8,
    ) -> None:
        location = parse_store_uri(uri)
        if location.scheme != "s3":
            raise InvalidArtifactURIError(
                f"S3ArtifactStore needs an s3://bucket/prefix URI, not {location.uri}; "
                "use vfops.artifacts.open_store(uri)"
            )
        if multipart_chunksize is None:
            multipart_chunksize = multipart_threshold
        if multipart_threshold < 1 or multipart_chunksize < 1 or max_concurrency < 1:
            raise InvalidArgumentError(
                "multipart_threshold, multipart_chunksize, max_concurrency must be >= 1"
            )
        super().__init__(location)
        self.bucket = location.bucket
        self.prefix = location.prefix
        self.endpoint_url = endpoint_url if endpoint_url is not None else s3_endpoint_url()
        self.multipart_threshold = multipart_threshold
        self.multipart_chunksize = max(multipart_chunksize, _MIN_PART_SIZE)
        self.max_concurrency = max_concurrency
        self._client: S3Client | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        endpoint = "" if self.endpoint_url is None else f", endpoint_url={self._endpoint_shown!r}"
        return f"S3ArtifactStore({self.uri!r}{endpoint})"

    @property
    def _endpoint_shown(self) -> str:
        return "AWS" if self.endpoint_url is None else redact_uri(self.endpoint_url)

    # -- client -----------------------------------------------------------------------

    @property
    def client(self) -> S3Client:
        """The boto3 S3 client, created on first use."""
        with self._lock:
            if self._client is None:
                self._client = self._make_client()
            return self._client

    def _make_client(self) -> S3Client:
        try:
            import boto3.session
            from botocore.config import Config
        except ImportError:  # pragma: no cover - boto3 is a core dependency
            raise ArtifactStoreError(
                f"boto3 is not installed, so {self.uri} cannot be used; pip install boto3"
            ) from None
        options: dict[str, Any] = {
            "retries": {"mode": "standard", "max_attempts": 5},
            "max_pool_connections": max(10, self.max_concurrency + 2),
        }
        if self.endpoint_url is not None:
            # MinIO and moto serve buckets by path, not by virtual host; they may also
            # reject the flexible checksums newer botocore sends by default.
            options["s3"] = {"addressing_style": "path"}
            options["request_checksum_calculation"] = "when_required"
            options["response_checksum_validation"] = "when_required"
        with self._errors(self.uri):
            session = boto3.session.Session()
            return session.client("s3", endpoint_url=self.endpoint_url, config=Config(**options))

    def _transfer_config(self) -> TransferConfig:
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(
            multipart_threshold=self.multipart_threshold,
            multipart_chunksize=self.multipart_chunksize,
            max_concurrency=self.max_concurrency,
            use_threads=True,
            preferred_transfer_client="classic",
        )

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    # -- publishing -------------------------------------------------------------------

    def put_file_tracked(self, path: StrPath, name: str | None = None) -> tuple[ArtifactRef, bool]:
        name = check_name(Path(path).name if name is None else name)
        with open_source(path) as src:
            before = os.fstat(src.fileno())
            sha256, size = sha256_stream(src)
        key = content_key(sha256, name)
        if self._present(key, sha256, size):
            self._touch(key)
            return self._ref(sha256, size, name), False
        with self._errors(self._location.child_uri(key)):
            self.client.upload_file(
                os.fspath(path),
                self.bucket,
                self._object_key(key),
                ExtraArgs=self._extra_args(sha256),
                Config=self._transfer_config(),
            )
        after = Path(path).stat()
        if (after.st_size, after.st_mtime_ns, after.st_ino) != (
            before.st_size,
            before.st_mtime_ns,
            before.st_ino,
        ):
            with contextlib.suppress(Exception):
                self.client.delete_object(Bucket=self.bucket, Key=self._object_key(key))
            raise ArtifactError(
                f"{path} changed while it was being published; publish it again once it "
                "is no longer being written"
            )
        log.debug("uploaded %s (%d bytes)", self._location.child_uri(key), size)
        return self._ref(sha256, size, name), True

    def _touch(self, key: str) -> None:
        """Refresh LastModified (a copy onto itself), so gc's grace period counts from now."""
        object_key = self._object_key(key)
        with self._errors(self._location.child_uri(key)):
            head = self.client.head_object(Bucket=self.bucket, Key=object_key)
            self.client.copy_object(
                Bucket=self.bucket,
                Key=object_key,
                CopySource={"Bucket": self.bucket, "Key": object_key},
                Metadata=dict(head.get("Metadata", {})),
                MetadataDirective="REPLACE",
                ContentType="application/octet-stream",
            )

    def iter_objects(self) -> Iterator[StoredObject]:
        root = f"{self.prefix}/" if self.prefix else ""
        paginator = self.client.get_paginator("list_objects_v2")
        with self._errors(self.uri):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=f"{root}{HASH_DIR}/"):
                for item in page.get("Contents", []):
                    key = item["Key"][len(root) :]
                    if not is_content_key(key):
                        continue
                    _, _, sha256, name = key.split("/")
                    modified = item["LastModified"]
                    yield StoredObject(
                        uri=self._location.child_uri(key),
                        sha256=sha256,
                        name=name,
                        size=int(item["Size"]),
                        modified=modified.astimezone(dt.UTC),
                    )

    def delete(self, ref: ArtifactRef | str) -> bool:
        key = self._key_of(ref)
        if self._head(key) is None:
            return False
        with self._errors(self._location.child_uri(key)):
            self.client.delete_object(Bucket=self.bucket, Key=self._object_key(key))
        return True

    def put_bytes(self, data: bytes, name: str) -> ArtifactRef:
        name = check_name(name)
        sha256, size = hashlib.sha256(data).hexdigest(), len(data)
        key = content_key(sha256, name)
        if self._present(key, sha256, size):
            return self._ref(sha256, size, name)
        with self._errors(self._location.child_uri(key)):
            self.client.upload_fileobj(
                io.BytesIO(data),
                self.bucket,
                self._object_key(key),
                ExtraArgs=self._extra_args(sha256),
                Config=self._transfer_config(),
            )
        log.debug("uploaded %s (%d bytes)", self._location.child_uri(key), size)
        return self._ref(sha256, size, name)

    def _present(self, key: str, sha256: str, size: int) -> bool:
        """Whether ``key`` already holds an object of this size (and hash, if recorded)."""
        head = self._head(key)
        if head is None or head.get("ContentLength") != size:
            return False
        recorded = head.get("Metadata", {}).get(_SHA256_METADATA)
        if recorded not in (None, sha256):
            return False
        log.debug("artifact %s already present; skipped", self._location.child_uri(key))
        return True

    @staticmethod
    def _extra_args(sha256: str) -> dict[str, Any]:
        return {
            "Metadata": {_SHA256_METADATA: sha256},
            "ContentType": "application/octet-stream",
        }

    # -- reading ----------------------------------------------------------------------

    def _object_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _head(self, key: str) -> dict[str, Any] | None:
        from botocore.exceptions import ClientError

        try:
            with self._errors(self._location.child_uri(key), reraise=(ClientError,)):
                response = self.client.head_object(Bucket=self.bucket, Key=self._object_key(key))
        except ClientError as exc:
            if _error_code(exc) in _NOT_FOUND_CODES:
                return None
            raise self._translate(exc, self._location.child_uri(key)) from None
        return dict(response)

    def _stat(self, key: str) -> int | None:
        head = self._head(key)
        return None if head is None else int(head["ContentLength"])

    def _download(self, key: str, out: BinaryIO) -> str | None:
        uri = self._location.child_uri(key)
        with self._errors(uri, not_found=self._not_found(key)):
            self.client.download_fileobj(
                self.bucket, self._object_key(key), out, Config=self._transfer_config()
            )
        return None  # parts may arrive out of order; the caller hashes the file

    # -- errors -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(
        self,
        uri: str,
        *,
        not_found: ArtifactNotFoundError | None = None,
        reraise: tuple[type[BaseException], ...] = (),
    ) -> Iterator[None]:
        """Turn boto3/botocore failures into one-line :class:`ArtifactStoreError`."""
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except reraise:
            raise
        except ClientError as exc:
            if not_found is not None and _error_code(exc) in _NOT_FOUND_CODES:
                raise not_found from None
            raise self._translate(exc, uri) from None
        except S3UploadFailedError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, ClientError):
                raise self._translate(cause, uri) from None
            raise ArtifactStoreError(
                f"upload to {uri} failed; check the bucket and network"
            ) from None
        except BotoCoreError as exc:
            raise self._translate(exc, uri) from None

    def _translate(self, exc: Exception, uri: str) -> ArtifactStoreError:
        from botocore.exceptions import (
            ClientError,
            EndpointConnectionError,
            HTTPClientError,
            NoCredentialsError,
            NoRegionError,
            PartialCredentialsError,
        )

        if isinstance(exc, NoCredentialsError | PartialCredentialsError):
            return ArtifactStoreError(
                f"no AWS credentials found for {uri}; set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment"
            )
        if isinstance(exc, NoRegionError):
            return ArtifactStoreError(f"no AWS region configured for {uri}; set AWS_DEFAULT_REGION")
        if isinstance(exc, EndpointConnectionError | HTTPClientError):
            return ArtifactStoreError(
                f"cannot reach the S3 endpoint ({self._endpoint_shown}) for {uri}; "
                "check VFOPS_S3_ENDPOINT_URL and the network"
            )
        if isinstance(exc, ClientError):
            code = _error_code(exc)
            if code == "NoSuchBucket":
                return ArtifactStoreError(
                    f"bucket {self.bucket!r} does not exist; create it or fix VFOPS_ARTIFACTS"
                )
            if code in _DENIED_CODES:
                return ArtifactStoreError(
                    f"S3 refused access to {uri} ({code}); check the AWS credentials and "
                    "the bucket policy"
                )
            return ArtifactStoreError(
                f"S3 request for {uri} failed ({code or 'unknown error'}); "
                "check the bucket, endpoint and credentials"
            )
        return ArtifactStoreError(
            f"S3 request for {uri} failed ({type(exc).__name__}); "
            "check the bucket, endpoint and credentials"
        )


def _error_code(exc: Exception) -> str:
    response: Any = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))
