"""Publishing, installing and provenance end to end: real CLI processes, real stores.

Each test runs on SQLite and PostgreSQL; artifact stores are a local folder and
S3 (moto's server mode over HTTP on loopback).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tests.registry_fixtures import DIALECTS, database_url
from vfops.artifacts import open_store
from vfops.registry import EnvironmentVersionRow, EvalRunRow, get_engine
from vfops.testing import StubConfig, StubServer

VFOPS = [sys.executable, "-m", "vfops"]


@pytest.fixture(params=DIALECTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path)


@pytest.fixture(params=["file", "s3"])
def artifacts(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return (tmp_path / "artifacts").as_uri()
    uri: str = request.getfixturevalue("s3_uri")
    return uri


def cli(
    *args: str, db: str, artifacts: str, python: str = sys.executable, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VFOPS_DATABASE_URL": db, "VFOPS_ARTIFACTS": artifacts}
    return subprocess.run(
        [python, "-m", "vfops", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def count_versions(db: str) -> int:
    with Session(get_engine(db)) as session:
        return int(session.scalar(select(func.count()).select_from(EnvironmentVersionRow)) or 0)


def artifact_files(artifacts: str) -> set[str]:
    if artifacts.startswith("file://"):
        root = Path(artifacts[len("file://") :])
        return {str(p) for p in root.rglob("*") if p.is_file()} if root.exists() else set()
    import boto3

    bucket = artifacts[len("s3://") :].split("/", 1)[0]
    client = boto3.client("s3", endpoint_url=os.environ["VFOPS_S3_ENDPOINT_URL"])
    listed = client.list_objects_v2(Bucket=bucket)
    return {item["Key"] for item in listed.get("Contents", [])}


def fresh_venv(path: Path) -> str:
    """A new virtualenv that sees vfops and its dependencies but no environment packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    purelib = next(path.glob("lib/python3*/site-packages"))
    main_site = next(p for p in sys.path if p.endswith("site-packages"))
    (purelib / "vfops_main.pth").write_text(f"import site; site.addsitedir({main_site!r})\n")
    return str(path / "bin" / "python")


def test_publish_install_and_eval_records_the_version(
    db_url: str, artifacts: str, tmp_path: Path
) -> None:
    assert (
        cli(
            "env", "init", "prov_env", "--path", str(tmp_path), db=db_url, artifacts=artifacts
        ).returncode
        == 0
    )
    package = tmp_path / "prov_env"

    first = cli("env", "publish", str(package), db=db_url, artifacts=artifacts)
    assert first.returncode == 0, first.stderr
    assert "published prov_env@0.1.0" in first.stdout

    again = cli("env", "publish", str(package), db=db_url, artifacts=artifacts)
    assert again.returncode == 0 and "nothing published" in again.stdout
    stored = artifact_files(artifacts)
    assert count_versions(db_url) == 1 and len(stored) == 3  # wheel, sdist, eval parquet

    with (package / "prov_env.py").open("a") as handle:
        handle.write("\n# a change\n")
    refused = cli("env", "publish", str(package), db=db_url, artifacts=artifacts)
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines() == [refused.stderr.strip()]
    assert (
        "already published with different content" in refused.stderr and "--bump" in refused.stderr
    )
    assert count_versions(db_url) == 1 and artifact_files(artifacts) == stored  # nothing written

    bumped = cli("env", "publish", str(package), "--bump", "patch", db=db_url, artifacts=artifacts)
    assert bumped.returncode == 0, bumped.stderr
    assert "published prov_env@0.1.1" in bumped.stdout
    assert 'version = "0.1.1"' in (package / "pyproject.toml").read_text()

    python = fresh_venv(tmp_path / "venv")
    installed = cli(
        "env",
        "install",
        "prov_env@0.1.1",
        "--no-deps",
        db=db_url,
        artifacts=artifacts,
        python=python,
    )
    assert installed.returncode == 0, installed.stderr
    with StubServer(StubConfig(reply_mode="arithmetic")) as stub:
        result = cli(
            "eval",
            "prov_env",
            "-m",
            "stub-model",
            "-b",
            stub.base_url,
            "-n",
            "4",
            "-r",
            "2",
            "-o",
            str(tmp_path / "out"),
            db=db_url,
            artifacts=artifacts,
            python=python,
        )
    assert result.returncode == 0, result.stderr
    with Session(get_engine(db_url)) as session:
        (run,) = session.scalars(select(EvalRunRow))
        version = session.get(EnvironmentVersionRow, run.environment_version_id)
        assert version is not None and version.version == "0.1.1"
        assert run.environment_version == "0.1.1"
        assert run.environment_content_hash == version.code_hash


def test_edited_installed_code_is_recorded_as_local(db_url: str, tmp_path: Path) -> None:
    artifacts = (tmp_path / "artifacts").as_uri()
    cli("env", "init", "edit_env", "--path", str(tmp_path), db=db_url, artifacts=artifacts)
    package = tmp_path / "edit_env"
    assert cli("env", "publish", str(package), db=db_url, artifacts=artifacts).returncode == 0
    python = fresh_venv(tmp_path / "venv")
    cli("env", "install", "edit_env", "--no-deps", db=db_url, artifacts=artifacts, python=python)
    (installed,) = (tmp_path / "venv").glob("lib/python3*/site-packages/edit_env.py")
    installed.write_text(installed.read_text() + "\n# edited after install\n")
    with StubServer(StubConfig(reply_mode="arithmetic")) as stub:
        result = cli(
            "eval",
            "edit_env",
            "-m",
            "stub-model",
            "-b",
            stub.base_url,
            "-n",
            "2",
            "-r",
            "1",
            "-o",
            str(tmp_path / "out"),
            db=db_url,
            artifacts=artifacts,
            python=python,
        )
    assert result.returncode == 0, result.stderr
    with Session(get_engine(db_url)) as session:
        (run,) = session.scalars(select(EvalRunRow))
    assert run.environment_version.startswith("local+") and run.environment_version_id is None


def _publish_one(db_url: str, artifacts: str, tmp_path: Path, name: str) -> EnvironmentVersionRow:
    cli("env", "init", name, "--path", str(tmp_path), db=db_url, artifacts=artifacts)
    published = cli("env", "publish", str(tmp_path / name), db=db_url, artifacts=artifacts)
    assert published.returncode == 0, published.stderr
    with Session(get_engine(db_url), expire_on_commit=False) as session:
        return session.scalars(select(EnvironmentVersionRow)).one()


def test_tampered_artifact_is_refused(db_url: str, artifacts: str, tmp_path: Path) -> None:
    version = _publish_one(db_url, artifacts, tmp_path, "tamper_env")
    wheel_uri = version.wheel_uri
    if wheel_uri.startswith("file://"):
        path = Path(wheel_uri[len("file://") :])
        path.write_bytes(path.read_bytes() + b"tampered")
    else:
        import boto3

        bucket, key = wheel_uri[len("s3://") :].split("/", 1)
        client = boto3.client("s3", endpoint_url=os.environ["VFOPS_S3_ENDPOINT_URL"])
        client.put_object(Bucket=bucket, Key=key, Body=b"not the wheel that was published")
    target = tmp_path / "target"
    result = cli(
        "env",
        "install",
        "tamper_env@0.1.0",
        "--target",
        str(target),
        "--no-deps",
        db=db_url,
        artifacts=artifacts,
    )
    assert result.returncode != 0
    assert "corrupted" in result.stderr and version.wheel_sha256 in result.stderr
    assert "Traceback" not in result.stderr
    assert not target.exists() or not any(target.iterdir())


def test_wheel_with_escaping_path_is_refused(db_url: str, tmp_path: Path) -> None:
    artifacts = (tmp_path / "artifacts").as_uri()
    version = _publish_one(db_url, artifacts, tmp_path, "escape_env")
    evil = io.BytesIO()
    with zipfile.ZipFile(evil, "w") as archive:
        archive.writestr("escape_env.py", "def load_environment(): ...\n")
        archive.writestr("../../evil.py", "print('escaped')\n")
    ref = open_store(artifacts).put_bytes(evil.getvalue(), "escape_env-0.1.0-py3-none-any.whl")
    with Session(get_engine(db_url)) as session, session.begin():
        row = session.get(EnvironmentVersionRow, version.id)
        assert row is not None
        row.wheel_uri, row.wheel_sha256 = ref.uri, ref.sha256
    result = cli(
        "env",
        "install",
        "escape_env",
        "--target",
        str(tmp_path / "t"),
        "--no-deps",
        db=db_url,
        artifacts=artifacts,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "../../evil.py" in result.stderr
    assert not (tmp_path / "evil.py").exists()


def craft_wheel(meta_name: str, meta_version: str, env_name: str, *, module: str = "") -> bytes:
    """A minimal wheel whose METADATA and entry point say what the arguments say."""
    module = module or env_name
    dist_info = f"{meta_name}-{meta_version}.dist-info"
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as archive:
        archive.writestr(f"{module}.py", "def load_environment(): ...\n")
        archive.writestr(
            f"{dist_info}/METADATA",
            f"Metadata-Version: 2.1\nName: {meta_name}\nVersion: {meta_version}\n",
        )
        archive.writestr(
            f"{dist_info}/entry_points.txt",
            f"[vfops.environments]\n{env_name} = {module}:load_environment\n",
        )
        archive.writestr(f"{dist_info}/WHEEL", "Wheel-Version: 1.0\n")
        archive.writestr(f"{dist_info}/RECORD", "")
    return data.getvalue()


@pytest.mark.parametrize(
    ("file_name", "wheel", "fragments"),
    [
        (
            "ident_env-0.2.0-py3-none-any.whl",
            ("ident_env", "0.2.0", "ident_env"),
            ["is version 0.2.0", "registered as ident_env@0.1.0"],
        ),
        (
            "ident_env-0.1.0-py3-none-any.whl",
            ("ident_env", "0.1.0", "other_env"),
            ["declares the environment other_env", "not 'ident_env' of ident_env@0.1.0"],
        ),
        (
            "ident_env-0.1.0-py3-none-any.whl",
            ("ident_env", "0.3.0", "ident_env"),
            ["0.1.0 in its file name", "ident_env 0.3.0 in its METADATA"],
        ),
    ],
    ids=["other-version", "other-entry-point", "filename-vs-metadata"],
)
def test_install_refuses_a_wheel_that_is_not_its_registry_row(
    tmp_path: Path, file_name: str, wheel: tuple[str, str, str], fragments: list[str]
) -> None:
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    artifacts = (tmp_path / "artifacts").as_uri()
    version = _publish_one(db_url, artifacts, tmp_path, "ident_env")
    # The stored bytes hash to what the row says; only the wheel's own identity is wrong.
    ref = open_store(artifacts).put_bytes(craft_wheel(*wheel), file_name)
    with Session(get_engine(db_url)) as session, session.begin():
        row = session.get(EnvironmentVersionRow, version.id)
        assert row is not None
        row.wheel_uri, row.wheel_sha256 = ref.uri, ref.sha256
    target = tmp_path / "target"
    result = cli(
        "env",
        "install",
        "ident_env@0.1.0",
        "--target",
        str(target),
        "--no-deps",
        db=db_url,
        artifacts=artifacts,
    )
    assert result.returncode != 0
    message = result.stderr.strip()
    assert message.splitlines() == [message], message
    for fragment in fragments:
        assert fragment in message
    assert not target.exists() or not any(target.iterdir())


def test_publish_checks_the_built_wheel_against_the_project(tmp_path: Path) -> None:
    """The publish-side check (what a build backend produced vs pyproject.toml)."""
    from vfops._errors import VfopsError
    from vfops.publishing._wheel import check_wheel_identity

    def wheel(name: str, *spec: str, module: str = "") -> Path:
        path = tmp_path / name
        path.write_bytes(craft_wheel(*spec, module=module))
        return path

    good = wheel("lucky_digit-0.1.0-py3-none-any.whl", "lucky-digit", "0.1.0", "lucky_digit")
    found = check_wheel_identity(
        good,
        env_name="lucky_digit",
        version="0.1.0",
        entry_point="lucky_digit:load_environment",
        distribution="lucky-digit",
    )
    assert found.environments == {"lucky_digit": "lucky_digit:load_environment"}
    refusals = [
        (
            dict(distribution="lucky-dice"),
            "is distribution lucky-digit but the project is lucky-dice",
        ),
        (dict(entry_point="other:load"), "but the project declares 'other:load'"),
        (dict(version="0.1.1"), "is version 0.1.0 but is registered as lucky_digit@0.1.1"),
    ]
    for change, fragment in refusals:
        kwargs = {
            "env_name": "lucky_digit",
            "version": "0.1.0",
            "entry_point": "lucky_digit:load_environment",
            "distribution": "lucky-digit",
            **change,
        }
        with pytest.raises(VfopsError) as info:
            check_wheel_identity(good, **kwargs)
        assert fragment in str(info.value) and len(str(info.value).splitlines()) == 1
    with pytest.raises(VfopsError, match="not a wheel file name"):
        check_wheel_identity(
            wheel("notawheel.whl", "x", "1.0.0", "x"), env_name="x", version="1.0.0"
        )


# -- concurrent publishes and gc ----------------------------------------------------------


def referenced_keys(db: str) -> set[str]:
    """Store keys (``.../sha256/<ab>/<sha>/<name>``) that registry rows point at."""
    from vfops.registry import referenced_artifact_uris

    with Session(get_engine(db)) as session:
        uris = referenced_artifact_uris(session)
    return {"/".join(uri.split("/")[-4:]) for uri in uris}


def stored_keys(artifacts: str) -> set[str]:
    return {"/".join(key.split("/")[-4:]) for key in artifact_files(artifacts)}


def race_packages(tmp_path: Path, *, same_content: bool) -> list[Path]:
    """Two folders of one environment, race_env@0.1.0 (same or different code)."""
    env = {**os.environ, "VFOPS_DATABASE_URL": f"sqlite:///{tmp_path / 'unused.db'}"}
    subprocess.run(
        [*VFOPS, "env", "init", "race_env", "--path", str(tmp_path / "a")], env=env, check=True
    )
    first = tmp_path / "a" / "race_env"
    second = tmp_path / "b" / "race_env"
    import shutil

    shutil.copytree(first, second)
    if not same_content:
        with (second / "race_env.py").open("a") as handle:
            handle.write("\n# the other contender\n")
    return [first, second]


@pytest.mark.parametrize("same_content", [False, True], ids=["other-content", "same-content"])
def test_a_losing_concurrent_publish_leaves_nothing_unreferenced(
    db_url: str,
    artifacts: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    same_content: bool,
) -> None:
    import threading

    from vfops._errors import VfopsError
    from vfops.publishing import _publish, publish_environment

    packages = race_packages(tmp_path, same_content=same_content)
    # Both publishes pass the registry check, build and upload, then meet here and race
    # for the row: the loser has written its own wheel, sdist and parquet by then.
    barrier = threading.Barrier(2, timeout=120)
    register = _publish._register
    one_at_a_time = threading.Lock()  # loading from source swaps sys.modules: not concurrent
    snapshot = _publish.snapshot_datasets

    def meet_then_register(*args: object, **kwargs: object) -> object:
        barrier.wait()
        return register(*args, **kwargs)  # type: ignore[arg-type]

    def serial_snapshot(*args: object, **kwargs: object) -> object:
        with one_at_a_time:
            return snapshot(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_publish, "_register", meet_then_register)
    monkeypatch.setattr(_publish, "snapshot_datasets", serial_snapshot)
    outcomes: dict[int, object] = {}

    def publish(i: int) -> None:
        try:
            outcomes[i] = publish_environment(
                packages[i], database_url=db_url, artifacts_uri=artifacts
            )
        except VfopsError as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    results = [o for o in outcomes.values() if not isinstance(o, Exception)]
    errors = [o for o in outcomes.values() if isinstance(o, Exception)]
    assert count_versions(db_url) == 1
    if same_content:  # the loser reports the winner's row: a no-op
        assert not errors and sorted(r.status for r in results) == ["published", "unchanged"]  # type: ignore[attr-defined]
    else:
        assert len(results) == 1 and len(errors) == 1
        message = str(errors[0])
        assert message.splitlines() == [message]
        assert "race_env@0.1.0" in message and "--bump patch" in message
    stored = stored_keys(artifacts)
    assert len(stored) == 3  # the winner's wheel, sdist and parquet; nothing of the loser
    assert stored == referenced_keys(db_url)
    assert all(key.startswith("sha256/") for key in stored)
    assert all("/environments/" in uri for uri in _uris(db_url))


def _uris(db: str) -> set[str]:
    from vfops.registry import referenced_artifact_uris

    with Session(get_engine(db)) as session:
        return referenced_artifact_uris(session)


def test_concurrent_cli_publishes_of_one_version(artifacts: str, tmp_path: Path) -> None:
    """Two real `vfops env publish` processes of race_env@0.1.0 with different code."""
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    packages = race_packages(tmp_path, same_content=False)
    env = {**os.environ, "VFOPS_DATABASE_URL": db_url, "VFOPS_ARTIFACTS": artifacts}
    procs = [
        subprocess.Popen(
            [*VFOPS, "env", "publish", str(p)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in packages
    ]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    codes = sorted(proc.returncode for proc in procs)
    assert codes[0] == 0 and codes[1] != 0, outputs
    (loser_err,) = [err for proc, (_, err) in zip(procs, outputs, strict=True) if proc.returncode]
    assert len(loser_err.strip().splitlines()) == 1 and "race_env@0.1.0" in loser_err, loser_err
    assert count_versions(db_url) == 1
    assert stored_keys(artifacts) == referenced_keys(db_url)


def test_env_gc_removes_only_old_unreferenced_objects(artifacts: str, tmp_path: Path) -> None:
    from vfops.publishing import environment_store

    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    version = _publish_one(db_url, artifacts, tmp_path, "gc_env")
    env = {**os.environ, "VFOPS_DATABASE_URL": db_url, "VFOPS_ARTIFACTS": artifacts}
    orphan = environment_store(artifacts).put_bytes(
        b"left by a lost publish", "gc_env-0.0.9.tar.gz"
    )
    legacy_orphan = open_store(artifacts).put_bytes(b"old layout", "gc_env-0.0.1.tar.gz")
    published = referenced_keys(db_url)
    assert len(published) == 3

    def gc(*args: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*VFOPS, "env", "gc", *args], env=env, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr
        return result

    young = gc()  # default grace: 24 h; the orphan was written just now
    assert "removed 0 unreferenced" in young.stdout and "1 younger than 24 h" in young.stdout
    dry = gc("--grace-hours", "0", "--dry-run")
    assert f"would remove {orphan.uri}" in dry.stdout and "kept 3 referenced" in dry.stdout
    assert "sha256/" + "/".join(orphan.uri.split("/")[-3:]) in stored_keys(artifacts)
    swept = gc("--grace-hours", "0")
    assert f"removed {orphan.uri}" in swept.stdout and "removed 1 unreferenced" in swept.stdout
    remaining = stored_keys(artifacts)
    assert published <= remaining and len(remaining) == 4  # + the legacy-layout object
    assert open_store(artifacts).exists(legacy_orphan)  # the old layout is opt-in
    legacy = gc("--grace-hours", "0", "--include-legacy")
    assert f"removed {legacy_orphan.uri}" in legacy.stdout
    assert stored_keys(artifacts) == published
    bad = subprocess.run(
        [*VFOPS, "env", "gc", "--grace-hours", "-1"], env=env, capture_output=True, text=True
    )
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1
    assert "--grace-hours" in bad.stderr
    # Still installable after the sweep.
    installed = cli(
        "env",
        "install",
        "gc_env",
        "--target",
        str(tmp_path / "t"),
        "--no-deps",
        db=db_url,
        artifacts=artifacts,
    )
    assert installed.returncode == 0, installed.stderr
    assert (
        version.wheel_uri.split("/")[-1] in installed.stdout or "gc_env@0.1.0" in installed.stdout
    )


def test_versions_published_under_the_old_layout_still_install(db_url: str, tmp_path: Path) -> None:
    artifacts = (tmp_path / "artifacts").as_uri()
    version = _publish_one(db_url, artifacts, tmp_path, "old_env")
    # Rewrite the row as a publish before environments/ wrote it: <store>/sha256/...
    store = open_store(artifacts)
    wheel = tmp_path / version.wheel_uri.rsplit("/", 1)[-1]
    open_store(version.wheel_uri.rsplit("/sha256/", 1)[0]).get_file(version.wheel_uri, wheel)
    old = store.put_file(wheel)
    assert "/environments/" not in old.uri
    with Session(get_engine(db_url)) as session, session.begin():
        row = session.get(EnvironmentVersionRow, version.id)
        assert row is not None
        row.wheel_uri = old.uri
    result = cli(
        "env",
        "install",
        "old_env@0.1.0",
        "--target",
        str(tmp_path / "t"),
        "--no-deps",
        db=db_url,
        artifacts=artifacts,
    )
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "t").glob("old_env*.py"))


def test_install_refuses_a_wheel_bomb(tmp_path: Path) -> None:
    """A zero-filled member past the entry cap (lowered here: no 180 MB files in tests)."""
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    artifacts = (tmp_path / "artifacts").as_uri()
    version = _publish_one(db_url, artifacts, tmp_path, "bomb_env")
    # A wheel that is otherwise what the row says (it installs once the caps are gone).
    data = io.BytesIO(craft_wheel("bomb_env", "0.1.0", "bomb_env"))
    with zipfile.ZipFile(data, "a", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb_env_data/zeros.bin", bytes(3 * 1024 * 1024))
    ref = open_store(artifacts).put_bytes(data.getvalue(), "bomb_env-0.1.0-py3-none-any.whl")
    with Session(get_engine(db_url)) as session, session.begin():
        row = session.get(EnvironmentVersionRow, version.id)
        assert row is not None
        row.wheel_uri, row.wheel_sha256 = ref.uri, ref.sha256
    target = tmp_path / "target"
    env = {
        **os.environ,
        "VFOPS_DATABASE_URL": db_url,
        "VFOPS_ARTIFACTS": artifacts,
        "VFOPS_EXTRACT_MAX_ENTRY_BYTES": str(1024 * 1024),
        "VFOPS_EXTRACT_MAX_RATIO": "100000",  # so the entry cap is the one that refuses
    }
    result = subprocess.run(
        [*VFOPS, "env", "install", "bomb_env", "--target", str(target), "--no-deps"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    message = result.stderr.strip()
    assert message.splitlines() == [message], message
    assert "entry 'bomb_env_data/zeros.bin' size 3145728" in message
    assert "limit 1048576" in message and "VFOPS_EXTRACT_MAX_ENTRY_BYTES" in message
    assert not target.exists() or not any(target.iterdir())
