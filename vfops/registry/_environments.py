"""Environments and their published versions (immutable once written)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version
from sqlalchemy import Engine, Select, select
from sqlalchemy.orm import Session

from vfops._errors import VfopsError
from vfops.registry._models import Base, EnvironmentRow, EnvironmentVersionRow, utcnow
from vfops.registry._sql import on_conflict_insert, session_dialect
from vfops.registry._transcripts import transcript_uris


def parse_version(
    version: str, *, fix: str = "use MAJOR.MINOR.PATCH, e.g. 0.1.0"
) -> tuple[int, int, int]:
    """``"1.10.0"`` -> ``(1, 10, 0)``; the registry orders versions by these numbers.

    Read as PEP 440 (``packaging``), so spellings of one version are one version:
    ``0.1.00`` and ``v0.1.0`` are 0.1.0. Only a plain MAJOR.MINOR.PATCH release is a
    publishable version (no pre-, post-, dev- or local part); ``fix`` ends the error.
    """
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise VfopsError(f"version {version!r} is not a valid PEP 440 version; {fix}") from None
    release = parsed.release
    # str(parsed) has every other part: 1!1.0.0, 1.0.0rc1, 1.0.0.post1, 1.0.0+local
    if len(release) != 3 or str(parsed) != ".".join(str(part) for part in release):
        raise VfopsError(f"version {version!r} is not a plain MAJOR.MINOR.PATCH; {fix}")
    major, minor, patch = release
    return major, minor, patch


def canonical_version(version: str) -> str:
    """The one spelling of ``version`` the registry stores and looks up (``0.1.00`` ->
    ``0.1.0``); raises :class:`VfopsError` (one line) when it is not a version."""
    return ".".join(str(part) for part in parse_version(version))


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


@dataclass(frozen=True)
class NewEnvironmentVersion:
    """A version to publish, as :func:`add_environment_version` records it (a new
    column is one field here). ``version`` in any spelling (stored canonical)."""

    name: str
    version: str
    content_hash: str
    code_hash: str
    wheel_sha256: str
    sdist_sha256: str
    wheel_uri: str
    sdist_uri: str
    datasets: Mapping[str, Any] | None = None
    dependencies: Sequence[Any] | None = None
    description: str | None = None
    readme: str | None = None


class VersionTaken(VfopsError):
    """A concurrent publish registered this version first: ``winner_content_hash`` is
    its content hash (None when its row could not be read)."""

    def __init__(self, winner_content_hash: str | None) -> None:
        super().__init__("the version was registered concurrently")
        self.winner_content_hash = winner_content_hash


def register_version(
    engine: Engine, new: NewEnvironmentVersion
) -> tuple[EnvironmentVersionRow, bool]:
    """Record ``new`` in one transaction, under concurrent publishes of the same version;
    the row and whether this call wrote it. The winner's row comes back (not written by
    this call) when its content is ``new``'s; another content raises
    :class:`VersionTaken`."""
    from sqlalchemy.exc import IntegrityError, OperationalError

    from vfops.registry._db import session_scope

    try:
        with session_scope(engine) as session:
            # First the environment row: on PostgreSQL a concurrent first publish of the
            # name blocks here until the other one commits, so the version lookup below
            # then sees the winner's row.
            get_or_create_environment(session, new.name)
            existing = find_version(session, new.name, new.version)
            if existing is not None and existing.content_hash == new.content_hash:
                _ = existing.environment
                return existing, False  # a retried or concurrent publish of this content
            if existing is not None:  # registered since this publish checked: it lost
                raise VersionTaken(existing.content_hash)
            row = add_environment_version(session, new)
            _ = row.environment  # loaded while the session is open
            if (row.wheel_uri, row.sdist_uri) != (new.wheel_uri, new.sdist_uri):
                return row, False  # committed between the lookup and the insert: theirs
    except VersionTaken:
        raise
    except (IntegrityError, OperationalError, VfopsError) as exc:
        # PostgreSQL: the loser's insert waits for the winner's commit, then sees its row
        # (VfopsError from add_environment_version) or hits the unique index; SQLite: the
        # loser's write finds the database locked.
        if isinstance(exc, OperationalError) and "locked" not in str(exc).lower():
            raise
        with session_scope(engine, write=False) as session:
            winner = find_version(session, new.name, new.version)
            if winner is not None:
                _ = winner.environment
        if winner is not None and winner.content_hash == new.content_hash:
            return winner, False
        if isinstance(exc, VfopsError) and winner is None:
            raise
        raise VersionTaken(winner.content_hash if winner is not None else None) from exc
    return row, True


def add_environment_version(session: Session, new: NewEnvironmentVersion) -> EnvironmentVersionRow:
    """Record a published version. Versions are immutable.

    Re-adding the same version with the same ``content_hash`` returns the existing
    row (a retried publish); with another hash it raises :class:`VfopsError`.
    """
    name, content_hash = new.name, new.content_hash
    major, minor, patch = parse_version(new.version)
    environment = get_or_create_environment(session, name)
    # by number, not by string: a row an older vfops stored as "0.1.00" is 0.1.0 too
    existing = session.scalar(
        select(EnvironmentVersionRow)
        .where(
            EnvironmentVersionRow.environment_id == environment.id,
            *_is_version(major, minor, patch),
        )
        .order_by(EnvironmentVersionRow.id.desc())
        .limit(1)
    )
    if existing is not None:
        if existing.content_hash == content_hash:
            return existing
        raise VfopsError(
            f"{name}@{existing.version} is already published with other content (content "
            f"hash {existing.content_hash[:12]}); versions are immutable: publish a new "
            "version (vfops env publish PATH --bump patch)"
        )
    row = EnvironmentVersionRow(
        environment_id=environment.id,
        version=f"{major}.{minor}.{patch}",  # stored canonical: one spelling per version
        version_major=major,
        version_minor=minor,
        version_patch=patch,
        content_hash=content_hash,
        code_hash=new.code_hash,
        wheel_sha256=new.wheel_sha256,
        sdist_sha256=new.sdist_sha256,
        wheel_uri=new.wheel_uri,
        sdist_uri=new.sdist_uri,
        datasets=dict(new.datasets or {}),
        dependencies=list(new.dependencies or []),
        description=new.description,
        readme=new.readme,
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


def _is_version(major: int, minor: int, patch: int) -> tuple[Any, ...]:
    return (
        EnvironmentVersionRow.version_major == major,
        EnvironmentVersionRow.version_minor == minor,
        EnvironmentVersionRow.version_patch == patch,
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

    ``version``: ``"latest"`` (any) or a version, in any spelling of it (``0.1.00`` is
    0.1.0; one that is not a version matches nothing); ``content_hash``: the hash
    of its source tree; ``code_hash``: the hash of the code its wheel installs.
    """
    query = _versions_of(name)
    if version != "latest":
        try:
            query = query.where(*_is_version(*parse_version(version)))
        except VfopsError:
            return None
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
    """Every artifact URI the registry points at: a published version's wheel, sdist and
    dataset snapshots, an archived run's transcripts.

    The artifact store's garbage collection keeps exactly these (and anything younger
    than its grace period).
    """
    uris = transcript_uris(session)
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
