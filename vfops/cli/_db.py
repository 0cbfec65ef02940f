"""``vfops db``: show and migrate the registry database's schema version.

A new database needs no command (the first vfops command creates it); these are
for an existing database after a vfops upgrade, and for checking which one is used.
"""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(help="Show and migrate the registry database schema.", no_args_is_help=True)

_URL_HELP = "Database URL (default: VFOPS_DATABASE_URL, else SQLite under VFOPS_HOME)."


@app.command("upgrade")
def upgrade_command(
    url: Annotated[str | None, typer.Option(help=_URL_HELP)] = None,
) -> None:
    """Migrate the registry database to this vfops's schema (head)."""
    # imported here: `vfops --help` must not pay for sqlalchemy and alembic
    from vfops._settings import database_url
    from vfops.registry import mask_url, upgrade

    url = url or database_url()
    before, after = upgrade(url)
    if before == after:
        typer.echo(f"{mask_url(url)} is already at {after} (head)")
    else:
        typer.echo(f"upgraded {mask_url(url)} from {before or 'an empty database'} to {after}")


@app.command("current")
def current_command(
    url: Annotated[str | None, typer.Option(help=_URL_HELP)] = None,
) -> None:
    """Print the database URL (password masked), its revision and this vfops's head."""
    from vfops._settings import database_url
    from vfops.registry import (
        current_revision,
        head_revision,
        is_known_revision,
        mask_url,
    )

    url = url or database_url()
    current = current_revision(url)
    head = head_revision()
    if current is None:
        state = "empty: created on first use"
    elif current == head:
        state = "up to date"
    elif all(is_known_revision(part) for part in current.split(",")):
        state = "behind: run `vfops db upgrade`"
    else:
        state = "ahead: migrated by a newer vfops; upgrade vfops"
    typer.echo(f"database: {mask_url(url)}")
    typer.echo(f"current:  {current or '(none)'}")
    typer.echo(f"head:     {head} ({state})")
