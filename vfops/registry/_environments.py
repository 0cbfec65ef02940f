"""Environments and their published versions (immutable once written)."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from vfops._errors import VfopsError
from vfops.registry._models import Base, EnvironmentRow, EnvironmentVersionRow, utcnow
from vfops.registry._sql import on_conflict_insert, session_dialect

_SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")


def parse_version(version: str) -> tuple[int, int, int]:
    """``"1.10.0"`` -> ``(1, 10, 0)``; the registry orders versions by these numbers."""
    match = _SEMVER.match(version)
    if match is None:
        raise VfopsError(f"version {version!r} is not MAJOR.MINOR.PATCH (e.g. 0.1.0)")
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def get_or_create_environment(session: Session, name: str) -> EnvironmentRow:
    """The environment row named ``name``, inserted if missing (safe under concurrency)."""
    query = select(EnvironmentRow).where(EnvironmentRow.name == name)
    row = session.scalar(query)
    if row is not None:
        return row
    table = Base.metadata.tables["environments"]
    # insert-or-ignore: a concurrent first publish of the same name is not an error
    statement = on_conflict_insert(session_dialect(session), table).values(
        name=name, created_at=utcnow()
    )
    session.execute(statement.on_conflict_do_nothing(index_elements=["name"]))
    row = session.scalar(query)
    assert row is not None  # inserted above, by us or by the concurrent writer
    return row


def add_environment_version(
    session: Session,
    name: str,
    version: str,
    *,
    content_hash: str,
    code_hash: str,
    wheel_sha256: str,
    sdist_sha256: str,
    wheel_uri: str,
    sdist_uri: str,
    datasets: dict[str, Any] | None = None,
    dependencies: list[Any] | None = None,
    description: str | None = None,
    readme: str | None = None,
) -> EnvironmentVersionRow:
    """Record a published version. Versions are immutable.

    Re-adding the same version with the same ``content_hash`` returns the existing
    row (a retried publish); with another hash it raises :class:`VfopsError`.
    """
    major, minor, patch = parse_version(version)
    environment = get_or_create_environment(session, name)
    existing = session.scalar(
        select(EnvironmentVersionRow).where(
            EnvironmentVersionRow.environment_id == environment.id,
            EnvironmentVersionRow.version == version,
        )
    )
    if existing is not None:
        if existing.content_hash == content_hash:
            return existing
        raise VfopsError(
            f"{name}@{version} is already published with other content (content hash "
            f"{existing.content_hash[:12]}); versions are immutable: publish a new version"
        )
    row = EnvironmentVersionRow(
        environment_id=environment.id,
        version=version,
        version_major=major,
        version_minor=minor,
        version_patch=patch,
        content_hash=content_hash,
        code_hash=code_hash,
        wheel_sha256=wheel_sha256,
        sdist_sha256=sdist_sha256,
        wheel_uri=wheel_uri,
        sdist_uri=sdist_uri,
        datasets=dict(datasets or {}),
        dependencies=list(dependencies or []),
        description=description,
        readme=readme,
    )
    row.environment = environment
    session.add(row)
    session.flush()
    return row


def _versions_of(name: str) -> Select[EnvironmentVersionRow]:
    # newest first by the numeric semver parts (1.10.0 > 1.9.0), never by the string
    return (
        select(EnvironmentVersionRow)
        .join(EnvironmentRow)
        .where(EnvironmentRow.name == name)
        .order_by(
            EnvironmentVersionRow.version_major.desc(),
            EnvironmentVersionRow.version_minor.desc(),
            EnvironmentVersionRow.version_patch.desc(),
            EnvironmentVersionRow.id.desc(),
        )
    )


def find_version(
    session: Session,
    name: str,
    version: str = "latest",
    *,
    content_hash: str | None = None,
    code_hash: str | None = None,
) -> EnvironmentVersionRow | None:
    """The highest published version of ``name`` that matches every filter given.

    ``version``: ``"latest"`` (any) or an exact version; ``content_hash``: the hash
    of its source tree; ``code_hash``: the hash of the code its wheel installs.
    """
    query = _versions_of(name)
    if version != "latest":
        query = query.where(EnvironmentVersionRow.version == version)
    if content_hash is not None:
        query = query.where(EnvironmentVersionRow.content_hash == content_hash)
    if code_hash is not None:
        query = query.where(EnvironmentVersionRow.code_hash == code_hash)
    return session.scalar(query.limit(1))


def list_environments(session: Session) -> list[EnvironmentRow]:
    """Every environment, by name."""
    return list(session.scalars(select(EnvironmentRow).order_by(EnvironmentRow.name)))


def list_versions(session: Session, name: str) -> list[EnvironmentVersionRow]:
    """The published versions of ``name``, newest (highest semver) first."""
    return list(session.scalars(_versions_of(name)))


def referenced_artifact_uris(session: Session) -> set[str]:
    """Every artifact URI a published version points at: wheels, sdists, dataset snapshots.

    The artifact store's garbage collection keeps exactly these (and anything younger
    than its grace period).
    """
    uris: set[str] = set()
    query = select(
        EnvironmentVersionRow.wheel_uri,
        EnvironmentVersionRow.sdist_uri,
        EnvironmentVersionRow.datasets,
    )
    for wheel_uri, sdist_uri, datasets in session.execute(query):
        uris.update((wheel_uri, sdist_uri))
        for info in (datasets or {}).values():
            if isinstance(info, dict) and isinstance(info.get("uri"), str):
                uris.add(info["uri"])
    return uris
