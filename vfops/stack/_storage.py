"""The stack's databases (one PostgreSQL server, three databases) and S3 buckets.

Raw DDL over psycopg: the stack creates and drops whole databases, which no ORM does,
on a server the caller names (without password: libpq's ``PGPASSWORD`` holds it). The
registry's schema is ``vfops db upgrade``'s; the buckets are made on moto's S3 server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vfops._errors import VfopsError
from vfops.stack._state import POSTGRES_URL_VAR, REGION, StackState, database_url, s3_keys

if TYPE_CHECKING:
    from psycopg import Connection


def _connect(admin: str) -> Connection[Any]:
    import psycopg

    try:
        return psycopg.connect(admin, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        reason = " ".join(str(exc).split())
        raise VfopsError(
            f"PostgreSQL is not reachable at {admin} ({reason}); start it, or point "
            f"--postgres-url ({POSTGRES_URL_VAR}) at a server this user may create databases on"
        ) from None


def create_databases(admin: str, names: list[str]) -> list[str]:
    """Create each missing database; returns those created."""
    from psycopg import sql

    created = []
    with _connect(admin) as connection:
        for name in names:
            row = connection.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if row is None:
                connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                created.append(name)
    return created


def drop_databases(admin: str, names: list[str]) -> None:
    from psycopg import sql

    with _connect(admin) as connection:
        for name in names:
            # FORCE: a connection left by a killed client must not keep it alive
            connection.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def create_buckets(state: StackState) -> None:
    import boto3

    access, secret = s3_keys()
    client = boto3.session.Session(aws_access_key_id=access, aws_secret_access_key=secret).client(
        "s3", endpoint_url=state.url("s3"), region_name=REGION
    )
    try:
        existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        for bucket in state.buckets.values():
            if bucket not in existing:
                client.create_bucket(Bucket=bucket)
    finally:
        client.close()


def upgrade_registry(state: StackState) -> None:
    from vfops.registry import dispose_engines, upgrade

    url = database_url(state.postgres_url, state.databases["registry"], "psycopg")
    try:
        upgrade(url)
    except VfopsError as exc:
        raise VfopsError(f"registry database {state.databases['registry']}: {exc}") from None
    finally:
        dispose_engines()
