"""Artifact stores (local directory and S3 over HTTP via moto) and safe archive extraction."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from vfops.artifacts import (
    DEFAULT_EXTRACT_LIMITS,
    ArchiveLimitError,
    ArtifactError,
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    ArtifactRef,
    ArtifactStore,
    ArtifactStoreError,
    ExtractLimits,
    InvalidArtifactNameError,
    InvalidArtifactURIError,
    LocalArtifactStore,
    S3ArtifactStore,
    UnsafeArchiveError,
    open_store,
    open_uri,
    safe_extract,
)

MiB = 1024 * 1024
THRESHOLD = 1 * MiB


# -- fixtures and helpers ---------------------------------------------------------------


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ArtifactStore]:
    if request.param == "local":
        uri = (tmp_path / "store").as_uri()
    else:
        uri = request.getfixturevalue("s3_uri")
    with open_store(uri, multipart_threshold=THRESHOLD) as opened:
        yield opened


def write_random(path: Path, size: int, seed: int = 0) -> bytes:
    data = (hashlib.sha256(str(seed).encode()).digest() * (size // 32 + 1))[:size]
    data = bytes(b ^ (i * 7 % 251) for i, b in enumerate(data[:4096])) + data[4096:]
    path.write_bytes(data)
    return data


def tamper(store: ArtifactStore, ref: ArtifactRef, data: bytes) -> None:
    """Overwrite the stored bytes behind the store's back."""
    key = ref.uri.removeprefix(store.uri + "/")
    if isinstance(store, LocalArtifactStore):
        (store.root / key).write_bytes(data)
    else:
        assert isinstance(store, S3ArtifactStore)
        store.client.put_object(Bucket=store.bucket, Key=f"{store.prefix}/{key}", Body=data)


def no_partial_files(directory: Path) -> bool:
    return not [p for p in directory.rglob("*") if p.name.endswith(".part")]


def count_uploads(store: ArtifactStore, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Count uploads (S3 transfers, or local renames into the store)."""
    calls: list[str] = []
    if isinstance(store, S3ArtifactStore):
        client = store.client
        for method in ("upload_file", "upload_fileobj", "put_object"):
            original = getattr(client, method)

            def spy(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                calls.append("upload")
                return _original(*args, **kwargs)

            monkeypatch.setattr(client, method, spy)
    else:
        real_replace = os.replace

        def spy_replace(src: Any, dst: Any) -> None:
            if str(dst).startswith(str(store.root)):  # type: ignore[attr-defined]
                calls.append("replace")
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", spy_replace)
    return lambda: len(calls)


# -- put / get --------------------------------------------------------------------------


@pytest.fixture
def s3_root(request: pytest.FixtureRequest) -> str:
    """``s3://<fresh bucket>/artifacts`` on the moto server (fake credentials in the env)."""
    uri: str = request.getfixturevalue("s3_uri")
    return uri


def test_put_get_round_trip_verifies_hash(store: ArtifactStore, tmp_path: Path) -> None:
    src = tmp_path / "pkg-0.1.0-py3-none-any.whl"
    data = write_random(src, 2 * MiB + 123)
    sha = hashlib.sha256(data).hexdigest()

    ref = store.put_file(src)

    assert ref == ArtifactRef(
        uri=f"{store.uri}/sha256/{sha[:2]}/{sha}/{src.name}",
        sha256=sha,
        size=len(data),
        name=src.name,
    )
    assert store.exists(ref) and store.exists(ref.uri)
    out = store.get_file(ref, tmp_path / "out" / "x.whl")
    assert out == tmp_path / "out" / "x.whl" and out.read_bytes() == data
    into_dir = store.get_file(ref.uri, tmp_path / "out")  # a directory: keeps the name
    assert into_dir == tmp_path / "out" / src.name and into_dir.read_bytes() == data
    assert no_partial_files(tmp_path)


def test_put_bytes_and_open_uri(store: ArtifactStore, tmp_path: Path) -> None:
    ref = store.put_bytes(b"hello artifacts\n", "hello.txt")
    assert ref.size == 16 and ref.name == "hello.txt"
    with open_uri(ref.uri) as same:
        assert type(same) is type(store) and same.uri == store.uri
        assert same.get_file(ref, tmp_path / "h.txt").read_bytes() == b"hello artifacts\n"


def test_put_is_idempotent(
    store: ArtifactStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "model.bin"
    write_random(src, 300_000)
    first = store.put_file(src)
    uploads = count_uploads(store, monkeypatch)

    assert store.put_file(src) == first
    assert store.put_bytes(src.read_bytes(), "model.bin") == first
    assert uploads() == 0
    if isinstance(store, LocalArtifactStore):
        assert not list((store.root / ".tmp").iterdir())


def test_content_addressing(store: ArtifactStore, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "data.json").write_bytes(b'{"x": 1}')
    (b / "data.json").write_bytes(b'{"x": 1}')
    ref_a, ref_b = store.put_file(a / "data.json"), store.put_file(b / "data.json")
    assert ref_a == ref_b
    renamed = store.put_file(a / "data.json", name="other.json")
    assert renamed.sha256 == ref_a.sha256 and renamed.uri != ref_a.uri
    assert renamed.uri.rsplit("/", 1)[0] == ref_a.uri.rsplit("/", 1)[0]
    different = store.put_bytes(b'{"x": 2}', "data.json")
    assert different.sha256 != ref_a.sha256 and different.uri != ref_a.uri
    assert store.uri_for(ref_a.sha256, "data.json") == ref_a.uri


def test_s3_multipart_upload_for_large_files(s3_root: str, tmp_path: Path) -> None:
    big, small = tmp_path / "big.bin", tmp_path / "small.bin"
    data = write_random(big, 6 * MiB + 17)  # > threshold: parts of 5 MiB (S3's minimum) + rest
    write_random(small, THRESHOLD - 1, seed=1)
    with open_store(s3_root, multipart_threshold=THRESHOLD) as store:
        assert isinstance(store, S3ArtifactStore)
        big_ref, small_ref = store.put_file(big), store.put_file(small)

        def etag(ref: ArtifactRef) -> str:
            key = ref.uri.removeprefix(f"s3://{store.bucket}/")
            return store.client.head_object(Bucket=store.bucket, Key=key)["ETag"].strip('"')

        assert etag(big_ref).endswith("-2")  # a multipart upload of two parts
        assert "-" not in etag(small_ref)  # a single PUT
        out = store.get_file(big_ref, tmp_path / "back.bin")
        assert out.read_bytes() == data


def test_s3_records_sha256_metadata(s3_root: str) -> None:
    with open_store(s3_root) as store:
        assert isinstance(store, S3ArtifactStore)
        ref = store.put_bytes(b"abc", "abc.txt")
        key = ref.uri.removeprefix(f"s3://{store.bucket}/")
        head = store.client.head_object(Bucket=store.bucket, Key=key)
        assert head["Metadata"] == {"sha256": ref.sha256}


# -- integrity --------------------------------------------------------------------------


@pytest.mark.parametrize("replacement", [b"X" * 64, b"short"], ids=["same-size", "other-size"])
def test_tampered_artifact_is_rejected(
    store: ArtifactStore, tmp_path: Path, replacement: bytes
) -> None:
    original = bytes(range(64))
    ref = store.put_bytes(original, "weights.safetensors")
    tamper(store, ref, replacement)
    dest_dir = tmp_path / "dest"
    dest = dest_dir / "weights.safetensors"

    with pytest.raises(ArtifactIntegrityError) as info:
        store.get_file(ref, dest)

    actual = hashlib.sha256(replacement).hexdigest()
    message = str(info.value)
    assert message == (
        f"artifact {ref.uri} is corrupted: sha256 is {actual}, expected {ref.sha256}; re-publish it"
    )
    assert (info.value.expected, info.value.actual, info.value.uri) == (ref.sha256, actual, ref.uri)
    assert not dest.exists() and no_partial_files(dest_dir)


def test_integrity_failure_keeps_existing_dest(store: ArtifactStore, tmp_path: Path) -> None:
    ref = store.put_bytes(b"good bytes", "a.txt")
    tamper(store, ref, b"evil bytes")
    dest = tmp_path / "a.txt"
    dest.write_bytes(b"previous")
    with pytest.raises(ArtifactIntegrityError):
        store.get_file(ref, dest)
    assert dest.read_bytes() == b"previous" and no_partial_files(tmp_path)


def test_republish_repairs_a_truncated_artifact(store: ArtifactStore, tmp_path: Path) -> None:
    ref = store.put_bytes(b"0123456789", "d.bin")
    tamper(store, ref, b"0123")
    assert store.put_bytes(b"0123456789", "d.bin") == ref
    assert store.get_file(ref, tmp_path / "d.bin").read_bytes() == b"0123456789"


def test_expected_sha256_overrides(store: ArtifactStore, tmp_path: Path) -> None:
    ref = store.put_bytes(b"payload", "p.bin")
    other = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(ArtifactIntegrityError, match=f"expected {other}"):
        store.get_file(ref.uri, tmp_path / "p.bin", expected_sha256=other)
    assert not (tmp_path / "p.bin").exists()
    assert store.get_file(ref.uri, tmp_path / "p.bin", expected_sha256=ref.sha256.upper())


def test_missing_artifact(store: ArtifactStore, tmp_path: Path) -> None:
    uri = store.uri_for("ab" * 32, "gone.txt")
    assert not store.exists(uri)
    with pytest.raises(ArtifactNotFoundError, match="does not exist"):
        store.get_file(uri, tmp_path / "gone.txt")
    assert not (tmp_path / "gone.txt").exists() and no_partial_files(tmp_path)


def test_bad_inputs(store: ArtifactStore, tmp_path: Path) -> None:
    with pytest.raises(ArtifactNotFoundError, match="does not exist"):
        store.put_file(tmp_path / "nope.whl")
    for name in ("../x", "a/b", "", ".hidden", "sp ace.txt", "x."):
        with pytest.raises(InvalidArtifactNameError, match="pass name="):
            store.put_bytes(b"x", name)
    foreign = "file:///elsewhere/sha256/ab/" + "ab" * 32 + "/x.txt"
    with pytest.raises(InvalidArtifactURIError, match="open_uri"):
        store.exists(foreign)
    with pytest.raises(InvalidArtifactURIError, match="not an artifact URI"):
        store.get_file(store.uri + "/x.txt", tmp_path / "x.txt")


@pytest.mark.parametrize(
    ("uri", "fragment"),
    [
        ("/srv/artifacts", "use file:///srv/artifacts"),
        ("file://remote/srv", "three slashes"),
        ("ftp://host/x", "unsupported"),
        ("s3://B/x", "bucket"),
        ("s3://bucket/a//b", "empty path component"),
        ("file:///srv/../etc", "'..'"),
    ],
)
def test_store_uri_validation(uri: str, fragment: str) -> None:
    with pytest.raises(InvalidArtifactURIError, match=fragment):
        open_store(uri)


def test_local_store_uri_round_trips_odd_paths(tmp_path: Path) -> None:
    root = tmp_path / "my store %41 #1"
    store = open_store(root.as_uri())
    assert isinstance(store, LocalArtifactStore) and store.root == root
    ref = store.put_bytes(b"x", "x.txt")
    assert (root / "sha256").is_dir()
    assert open_uri(ref.uri).uri == store.uri
    localhost_uri = ref.uri.replace("file://", "file://localhost", 1)
    assert store.exists(localhost_uri)
    out = store.get_file(ref, f"{tmp_path}/new-dir/")
    assert out == tmp_path / "new-dir" / "x.txt" and out.read_bytes() == b"x"


def test_default_store_is_vfops_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VFOPS_ARTIFACTS", raising=False)
    monkeypatch.setenv("VFOPS_HOME", str(tmp_path))
    store = open_store()
    assert isinstance(store, LocalArtifactStore)
    assert store.root == tmp_path / "artifacts"


# -- secrets ----------------------------------------------------------------------------


def test_secrets_never_printed(
    s3_root: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secrets = [os.environ[v] for v in ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID")]
    secrets.append(os.environ["AWS_SESSION_TOKEN"])
    assert all(len(s) > 12 for s in secrets)  # distinctive fake values set by aws_fake_env
    caplog.set_level(logging.DEBUG, logger="vfops")
    texts: list[str] = []
    with open_store(s3_root) as store:
        ref = store.put_bytes(b"secret-free", "s.txt")
        store.get_file(ref, tmp_path / "s.txt")
        texts += [repr(store), str(store), repr(ref), str(vars(store))]
        tamper(store, ref, b"tampered!!!")
        with pytest.raises(ArtifactIntegrityError) as integrity:
            store.get_file(ref, tmp_path / "t.txt")
        texts.append(str(integrity.value))
    with open_store("s3://vfops-no-such-bucket/p") as missing:
        with pytest.raises(ArtifactStoreError, match="does not exist; create it") as bucket:
            missing.put_bytes(b"x", "x.txt")
        texts += [str(bucket.value), repr(missing)]
    leaky = S3ArtifactStore(s3_root, endpoint_url=f"http://user:{secrets[0]}@h:1")
    texts.append(repr(leaky))
    with pytest.raises(InvalidArtifactURIError) as embedded:
        open_store(f"s3://{secrets[1]}:{secrets[0]}@bucket/p")
    texts.append(str(embedded.value))
    texts.append(caplog.text)

    joined = "\n".join(texts)
    assert "uploaded s3://" in caplog.text
    for secret in secrets:
        assert secret not in joined


def test_import_does_not_load_boto3() -> None:
    code = (
        "import sys, vfops.artifacts\n"
        "print(any(m.startswith(('boto', 'moto')) for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- safe_extract -----------------------------------------------------------------------


def make_tar(path: Path, entries: list[tarfile.TarInfo | tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w:gz" if path.name.endswith(".gz") else "w") as tar:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                tar.addfile(entry)
            else:
                name, data = entry
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


def make_zip(path: Path, entries: list[tuple[str, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in entries:
            zf.writestr(zipfile.ZipInfo(name), data)
    return path


def test_safe_extract_accepts_normal_archives(tmp_path: Path) -> None:
    tgz = make_tar(
        tmp_path / "env.tar.gz",
        [
            ("pkg/__init__.py", b"x = 1\n"),
            ("pkg/data/a.txt", b"a"),
            link("pkg/alias", "data/a.txt"),
        ],
    )
    out = safe_extract(tgz, tmp_path / "tgz")
    assert (out / "pkg" / "__init__.py").read_text() == "x = 1\n"
    assert (out / "pkg" / "alias").is_symlink() and (out / "pkg" / "alias").read_text() == "a"

    whl = make_zip(
        tmp_path / "pkg-0.1-py3-none-any.whl",
        [("pkg/__init__.py", b""), ("pkg-0.1.dist-info/METADATA", b"Name: pkg\n")],
    )
    out = safe_extract(whl, tmp_path / "whl")
    assert (out / "pkg-0.1.dist-info" / "METADATA").read_text() == "Name: pkg\n"
    plain = make_tar(tmp_path / "p.tar", [("./a/b.txt", b"b")])
    assert (safe_extract(plain, tmp_path / "tar") / "a" / "b.txt").read_bytes() == b"b"


@pytest.mark.parametrize(
    ("entries", "entry", "reason"),
    [
        ([("../evil", b"x")], "../evil", "'..'"),
        ([("ok/../../evil", b"x")], "ok/../../evil", "'..'"),
        ([("/abs/evil", b"x")], "/abs/evil", "absolute path"),
        ([link("esc", "../../outside")], "esc", "symlink to '../../outside' outside"),
        ([link("esc", "/etc/passwd")], "esc", "absolute path '/etc/passwd'"),
        (
            [link("hard", "../outside", tarfile.LNKTYPE)],
            "hard",
            "hard link to '../outside' outside",
        ),
        ([link("dot", "."), link("dot/up", "..")], "dot/up", "outside"),
        ([link("d", "."), link("e", "d/..")], "e", "outside"),
        ([link("fifo", "", tarfile.FIFOTYPE)], "fifo", "device or FIFO"),
    ],
    ids=[
        "dotdot",
        "nested-dotdot",
        "absolute",
        "symlink-up",
        "symlink-abs",
        "hardlink",
        "via-link",
        "link-chain",
        "fifo",
    ],
)
def test_safe_extract_refuses_unsafe_tar(
    tmp_path: Path, entries: list[tarfile.TarInfo | tuple[str, bytes]], entry: str, reason: str
) -> None:
    archive = make_tar(tmp_path / "bad.tar.gz", entries)
    dest = tmp_path / "a" / "b" / "dest"
    with pytest.raises(UnsafeArchiveError) as info:
        safe_extract(archive, dest)
    assert info.value.entry == entry and reason in str(info.value)
    assert f"entry {entry!r}" in str(info.value)
    assert not (tmp_path / "a" / "evil").exists() and not (tmp_path / "evil").exists()


@pytest.mark.parametrize(
    ("name", "reason"),
    [("../evil.py", "'..'"), ("/abs/evil.py", "absolute path"), ("C:/evil.py", "absolute")],
)
def test_safe_extract_refuses_unsafe_zip(tmp_path: Path, name: str, reason: str) -> None:
    archive = make_zip(tmp_path / "bad-0.1-py3-none-any.whl", [("ok.py", b""), (name, b"x")])
    with pytest.raises(UnsafeArchiveError, match=reason) as info:
        safe_extract(archive, tmp_path / "dest")
    assert info.value.entry == name
    assert not (tmp_path / "dest" / "ok.py").exists()  # nothing is extracted on refusal


def test_safe_extract_refuses_escaping_zip_symlink(tmp_path: Path) -> None:
    archive = tmp_path / "l.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        info = zipfile.ZipInfo("link")
        info.external_attr = 0o120777 << 16
        zf.writestr(info, "../../etc/passwd")
    with pytest.raises(UnsafeArchiveError, match="symlink"):
        safe_extract(archive, tmp_path / "dest")


def test_safe_extract_unsupported_type(tmp_path: Path) -> None:
    (tmp_path / "x.rar").write_bytes(b"")
    with pytest.raises(Exception, match="unsupported archive type"):
        safe_extract(tmp_path / "x.rar", tmp_path / "dest")


# -- extraction caps -------------------------------------------------------------------


def zero_wheel(path: Path, size: int, name: str = "pkg/zeros.bin") -> Path:
    """A wheel whose one big member is ``size`` zero bytes (deflated to a few KiB)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("pkg/__init__.py", "")
        zf.writestr(name, bytes(size))
    return path


def assert_nothing_left(parent: Path, dest: Path) -> None:
    """No destination and no staging folder: a refused archive leaves no trace."""
    assert not dest.exists()
    assert [p.name for p in parent.iterdir() if p.name.startswith(f".{dest.name}.")] == []


@pytest.mark.parametrize(
    ("var", "value", "what"),
    [
        ("VFOPS_EXTRACT_MAX_ENTRY_BYTES", "1048576", "entry 'pkg/zeros.bin' size 2097152"),
        ("VFOPS_EXTRACT_MAX_TOTAL_BYTES", "1500000", "total uncompressed size 2097152"),
        ("VFOPS_EXTRACT_MAX_ENTRIES", "1", "number of entries 2"),
        (None, None, "compression ratio"),  # 2 MiB of zeros deflate ~1000x: above 100x
    ],
    ids=["entry", "total", "entries", "ratio"],
)
def test_safe_extract_refuses_archives_past_a_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, var: str | None, value: str, what: str
) -> None:
    wheel = zero_wheel(tmp_path / "bomb-0.1-py3-none-any.whl", 2 * MiB)
    if var is not None:
        monkeypatch.setenv(var, value)
        monkeypatch.setenv("VFOPS_EXTRACT_MAX_RATIO", "1000000")  # isolate the cap under test
    dest = tmp_path / "out" / "dest"
    with pytest.raises(ArchiveLimitError) as info:
        safe_extract(wheel, dest)
    message = str(info.value)
    assert message.splitlines() == [message]
    assert what in message and info.value.env_var in message
    if var is not None:
        assert info.value.env_var == var and f"limit {value}" in message
    assert_nothing_left(tmp_path / "out", dest)


def test_raising_the_cap_lets_the_archive_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = zero_wheel(tmp_path / "big-0.1-py3-none-any.whl", 2 * MiB)
    monkeypatch.setenv("VFOPS_EXTRACT_MAX_RATIO", "5000")
    out = safe_extract(wheel, tmp_path / "dest")
    assert (out / "pkg" / "zeros.bin").stat().st_size == 2 * MiB
    assert DEFAULT_EXTRACT_LIMITS.max_total_bytes == 512 * MiB
    assert ExtractLimits.from_env().max_ratio == 5000.0
    monkeypatch.setenv("VFOPS_EXTRACT_MAX_ENTRIES", "lots")
    with pytest.raises(ArtifactError, match=r"VFOPS_EXTRACT_MAX_ENTRIES='lots' is not a positive"):
        safe_extract(wheel, tmp_path / "again")


def test_safe_extract_refuses_a_tar_bomb_from_its_headers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VFOPS_EXTRACT_MAX_TOTAL_BYTES", str(MiB))
    tgz = make_tar(tmp_path / "b.tar.gz", [("a.bin", bytes(MiB // 2)), ("b.bin", bytes(MiB))])
    dest = tmp_path / "dest"
    with pytest.raises(ArchiveLimitError, match="VFOPS_EXTRACT_MAX_TOTAL_BYTES"):
        safe_extract(tgz, dest)
    assert_nothing_left(tmp_path, dest)


def lying_zip(path: Path, real: bytes, declared: int) -> Path:
    """A zip whose central directory claims ``declared`` bytes for a member holding ``real``."""
    make_zip(path, [("ok.txt", b"fine"), ("big.bin", real)])
    data = bytearray(path.read_bytes())
    # Patch the uncompressed size in big.bin's local header and central directory entry.
    local = data.index(b"PK\x03\x04" + data[4:6], data.index(b"big.bin") - 40)
    central = data.index(b"PK\x01\x02", local)
    central = data.index(b"PK\x01\x02", central + 4)  # the second entry: big.bin
    data[local + 22 : local + 26] = declared.to_bytes(4, "little")
    data[central + 24 : central + 28] = declared.to_bytes(4, "little")
    path.write_bytes(bytes(data))
    return path


def test_safe_extract_refuses_an_entry_bigger_than_its_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The header claims 100 bytes, under every cap; the member really holds 2 MiB.
    monkeypatch.setenv("VFOPS_EXTRACT_MAX_ENTRY_BYTES", str(MiB))
    archive = lying_zip(tmp_path / "liar.zip", os.urandom(2 * MiB), declared=100)
    with zipfile.ZipFile(archive) as zf:
        assert zf.getinfo("big.bin").file_size == 100  # the lie is what a header check sees
    dest = tmp_path / "dest"
    with pytest.raises(ArtifactError) as info:
        safe_extract(archive, dest)
    message = str(info.value)
    assert message.splitlines() == [message] and "liar.zip" in message
    assert_nothing_left(tmp_path, dest)
