"""Alembic environment of the vfops registry (SQLite and PostgreSQL).

vfops runs migrations in code (``vfops.registry._db``) and hands this script its
own connection in ``config.attributes["connection"]``, already inside a locked
transaction, so a migration is all-or-nothing on both dialects. Run through the
``alembic`` command (``alembic -c migrations/alembic.ini ...``, for writing new
revisions), the URL comes from ``-x url=...``, else ``VFOPS_DATABASE_URL`` /
``VFOPS_HOME`` like every other vfops command.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from vfops.registry._models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url")
    if url:
        return url
    configured = config.get_main_option("sqlalchemy.url")
    if configured:
        return configured
    from vfops._settings import database_url

    return database_url()


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things: autogenerate must emit batch operations
        render_as_batch=connection.dialect.name == "sqlite",
        # both dialects run DDL inside the transaction (SQLite can; see _db.py)
        transactional_ddl=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    from vfops.registry._db import get_engine, transaction

    with transaction(get_engine(_url(), check_schema=False)) as own_connection:
        _configure(own_connection)


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
