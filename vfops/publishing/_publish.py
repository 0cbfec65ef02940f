"""``vfops env publish`` and ``vfops env install NAME@VERSION``.

Publishing is refuse-first: every check that can refuse runs before anything is
built, uploaded or written, so a refused publish leaves no trace. Artifacts are
content-addressed (re-uploading is a no-op) and the version row is written in
one transaction at the end.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from vfops._errors import VfopsError
from vfops.publishing._build import build_distributions, snapshot_datasets
from vfops.publishing._hashing import content_hash, wheel_code_hash
from vfops.publishing._project import (
    Bump,
    EnvironmentProject,
    bumped,
    parse_semver,
    read_project,
    write_version,
)
from vfops.publishing._wheel import check_wheel_identity
from vfops.registry import EnvironmentVersionRow, list_versions, parse_version

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

    from vfops.artifacts import ArtifactRef, ArtifactStore


log = logging.getLogger("vfops.publishing")


@dataclass(frozen=True)
class PublishResult:
    env_name: str
    version: str
    status: Literal["published", "unchanged"]
    content_hash: str
    code_hash: str
    wheel_uri: str
    datasets: dict[str, Any] = field(default_factory=dict)


def publish_environment(
    path: Path,
    *,
    bump: Bump | None = None,
    database_url: str | None = None,
    artifacts_uri: str | None = None,
) -> PublishResult:
    """Build, hash, snapshot, upload and register an environment package."""
    from vfops.registry import get_engine, session_scope

    path = path.resolve()
    project = read_project(path)
    digest = content_hash(path)
    engine = get_engine(database_url)
    with session_scope(engine, write=False) as session:
        versions = list_versions(session, project.env_name)
        unchanged = [v for v in versions if v.content_hash == digest]
        if unchanged:  # identical content: report the version that has it
            return _result(max(unchanged, key=_semver_key), "unchanged")
        new_version = _choose_version(project, versions, bump)
    original_pyproject = (path / "pyproject.toml").read_text()
    if new_version != project.version:
        write_version(path, new_version)
    try:
        project = read_project(path)
        store = environment_store(artifacts_uri)
        with tempfile.TemporaryDirectory(prefix="vfops-publish-") as tmp:
            work = Path(tmp)
            built = build_distributions(project, work / "dist")
            # The wheel must be what the row will say it is (a build backend may disagree
            # with the pyproject.toml vfops read).
            check_wheel_identity(
                built.wheel,
                env_name=project.env_name,
                version=project.version,
                entry_point=project.entry_point,
                distribution=project.distribution,
            )
            code = wheel_code_hash(built.wheel, project.top_level_module)
            snapshots = snapshot_datasets(project, _mkdir(work / "data"))
            uploads = _Uploads(store)
            try:
                wheel_ref = uploads.put(built.wheel)
                sdist_ref = uploads.put(built.sdist)
                datasets = {}
                for snap in snapshots:
                    ref = uploads.put(snap.path)
                    datasets[snap.split] = {
                        "uri": ref.uri,
                        "sha256": ref.sha256,
                        "rows": snap.rows,
                    }
                row, won = _register(engine, project, digest, code, wheel_ref, sdist_ref, datasets)
            except BaseException:
                uploads.remove_unreferenced(engine)
                raise
            if not won:  # a concurrent publish of the same content registered first
                uploads.remove_unreferenced(engine)
                return _result(row, "unchanged")
            uploads.ensure_present()
    except BaseException:
        (path / "pyproject.toml").write_text(original_pyproject)
        raise
    return _result(row, "published")


def environment_store(artifacts_uri: str | None = None) -> ArtifactStore:
    """The ``environments/`` part of the artifact store (``VFOPS_ARTIFACTS``).

    Published wheels, sdists and dataset snapshots live there, content-addressed
    (``environments/sha256/<ab>/<sha256>/<file>``), so ``vfops env gc`` can sweep them
    without touching anything else kept in the store. Versions published before this
    layout point at ``<store>/sha256/...``; their URIs are read as they are.
    """
    from vfops.artifacts import open_store

    root = open_store(artifacts_uri)
    return open_store(f"{root.uri.rstrip('/')}/{ENVIRONMENTS_PREFIX}")


ENVIRONMENTS_PREFIX = "environments"


class _Uploads:
    """The artifacts one publish put in the store, and which of them it wrote itself."""

    def __init__(self, store: ArtifactStore) -> None:
        self.store = store
        self.sources: list[tuple[Path, ArtifactRef]] = []
        self.created: list[ArtifactRef] = []

    def put(self, path: Path) -> ArtifactRef:
        ref, created = self.store.put_file_tracked(path)
        self.sources.append((path, ref))
        if created:
            self.created.append(ref)
        return ref

    def remove_unreferenced(self, engine: Engine) -> None:
        """After a failed or lost publish: delete what only this publish wrote.

        An object that was already in the store is someone else's; one this publish
        wrote is kept when a registry row points at it (the winner wrote the same bytes).
        Best effort: what is left behind is for ``vfops env gc``.
        """
        if not self.created:
            return
        from vfops.registry import referenced_artifact_uris, session_scope

        try:
            with session_scope(engine) as session:
                referenced = artifact_keys(referenced_artifact_uris(session))
            for ref in self.created:
                if (ref.sha256, ref.name) not in referenced:
                    self.store.delete(ref)
                    log.info("removed %s: no published version refers to it", ref.uri)
        except Exception as exc:  # the original error matters more than the clean-up's
            log.warning("could not remove this publish's artifacts (%s); run vfops env gc", exc)

    def ensure_present(self) -> None:
        """Re-upload any artifact deleted between its upload and the row (a racing gc or
        a racing loser's clean-up), so a published row never points at nothing."""
        for path, ref in self.sources:
            if not self.store.exists(ref):
                log.warning("%s vanished while publishing; uploading it again", ref.uri)
                self.store.put_file(path)


def artifact_keys(uris: set[str]) -> set[tuple[str, str]]:
    """(sha256, file name) of each artifact URI: the same bytes whatever the store's URI."""
    from vfops.artifacts import InvalidArtifactURIError, parse_artifact_uri

    keys = set()
    for uri in uris:
        try:
            parsed = parse_artifact_uri(uri)
        except InvalidArtifactURIError:
            continue
        keys.add((parsed.sha256, parsed.name))
    return keys


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _semver_key(version: EnvironmentVersionRow) -> tuple[int, int, int]:
    return (version.version_major, version.version_minor, version.version_patch)


def _choose_version(
    project: EnvironmentProject, versions: list[EnvironmentVersionRow], bump: Bump | None
) -> str:
    # by number: "0.1.00" in pyproject.toml is 0.1.0, never a second version beside it
    declared = project.version
    taken = {_semver_key(v): v for v in versions}
    if bump is None:
        existing = taken.get(parse_semver(declared))
        if existing is not None:
            spelled = (
                f" (version {project.declared_version!r} in pyproject.toml is {declared})"
                if project.declared_version not in ("", existing.version)
                else ""
            )
            raise VfopsError(
                f"{project.env_name}@{existing.version} is already published with different "
                f"content{spelled} (content hash {existing.content_hash[:12]}, now different); "
                f"versions are immutable: publish a new one with: vfops env publish "
                f"{project.path} --bump patch"
            )
        return declared
    latest = max(taken, default=None)
    base = max(parse_semver(declared), latest) if latest else parse_semver(declared)
    return bumped(".".join(str(part) for part in base), bump)


def _register(
    engine: Engine,
    project: EnvironmentProject,
    digest: str,
    code: str,
    wheel_ref: ArtifactRef,
    sdist_ref: ArtifactRef,
    datasets: dict[str, Any],
) -> tuple[EnvironmentVersionRow, bool]:
    """Write the version row in one transaction; return it and whether this call wrote it.

    Two concurrent publishes of one version: one row wins. The other gets the winner's
    row back when the content is the same (a no-op), else a one-line error.
    """
    from vfops.registry import NewEnvironmentVersion, VersionTaken, register_version

    new = NewEnvironmentVersion(
        name=project.env_name,
        version=project.version,
        content_hash=digest,
        code_hash=code,
        wheel_sha256=wheel_ref.sha256,
        sdist_sha256=sdist_ref.sha256,
        wheel_uri=wheel_ref.uri,
        sdist_uri=sdist_ref.uri,
        datasets=datasets,
        dependencies=project.dependencies,
        description=project.description,
        readme=project.readme,
    )
    try:
        return register_version(engine, new)
    except VersionTaken as lost:
        raise _lost(project, lost.winner_content_hash) from lost


def _lost(project: EnvironmentProject, winner_content: str | None) -> VfopsError:
    if winner_content is None:
        return VfopsError(
            f"{project.env_name}@{project.version} was published concurrently; "
            "run vfops env publish again (identical content is a no-op)"
        )
    return VfopsError(
        f"{project.env_name}@{project.version} was published concurrently with other content "
        f"(content hash {winner_content[:12]}); versions are immutable: publish a new one "
        f"with: vfops env publish {project.path} --bump patch"
    )


def _result(row: EnvironmentVersionRow, status: Literal["published", "unchanged"]) -> PublishResult:
    return PublishResult(
        env_name=row.environment.name,
        version=row.version,
        status=status,
        content_hash=row.content_hash,
        code_hash=row.code_hash,
        wheel_uri=row.wheel_uri,
        datasets=dict(row.datasets),
    )


# --- install ------------------------------------------------------------------------
def parse_ref(ref: str) -> tuple[str, str]:
    """``NAME``, ``NAME@latest`` or ``NAME@1.2.3`` -> (name, version-or-"latest")."""
    name, _, version = ref.partition("@")
    if not name:
        raise VfopsError(f"invalid environment reference {ref!r}; use NAME or NAME@VERSION")
    return name, version or "latest"


def find_published(session: Session, name: str, version: str = "latest") -> EnvironmentVersionRow:
    versions = list_versions(session, name)
    if not versions:
        raise VfopsError(
            f"environment '{name}' has no published version; publish it with: "
            "vfops env publish PATH"
        )
    if version == "latest":
        return max(versions, key=_semver_key)
    # by number, so any spelling finds it (NAME@0.1.00 is 0.1.0)
    wanted = parse_version(version, fix=f"use {name}@MAJOR.MINOR.PATCH or {name}@latest")
    for row in versions:
        if _semver_key(row) == wanted:
            return row
    known = ", ".join(v.version for v in sorted(versions, key=_semver_key))
    raise VfopsError(f"{name}@{version} is not published (published: {known})")


def install_published(
    ref: str,
    *,
    database_url: str | None = None,
    python: str = sys.executable,
    target: Path | None = None,
    no_deps: bool = False,
) -> EnvironmentVersionRow:
    """Download a published wheel, verify its hash and archive paths, pip-install it."""
    from vfops.artifacts import open_uri, safe_extract
    from vfops.registry import get_engine, session_scope

    name, version = parse_ref(ref)
    with session_scope(get_engine(database_url), write=False) as session:
        row = find_published(session, name, version)
        _ = row.environment  # loaded before the session closes
    with tempfile.TemporaryDirectory(prefix="vfops-install-") as tmp:
        wheel = Path(tmp) / row.wheel_uri.rsplit("/", 1)[-1]
        open_uri(row.wheel_uri).get_file(row.wheel_uri, wheel, row.wheel_sha256)
        safe_extract(wheel, Path(tmp) / "check")  # refuses escaping entries and bombs
        # The bytes match the row's hash; the wheel inside must also be the row's version.
        check_wheel_identity(wheel, env_name=row.environment.name, version=row.version)
        command = [python, "-m", "pip", "install", "--quiet", str(wheel)]
        if target is not None:
            command += ["--target", str(target)]
        if no_deps:
            command.append("--no-deps")
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        if completed.returncode != 0:
            lines = [ln for ln in completed.stderr.splitlines() if ln.strip()]
            errors = [ln for ln in lines if ln.upper().startswith("ERROR")]
            raise VfopsError(
                f"installing {name}@{row.version} failed: {(errors or lines or ['pip failed'])[-1]}"
            )
    return row
