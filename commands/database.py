"""Reaching the database from a command, without creating one by mistake."""

from __future__ import annotations

from collections.abc import Callable

from tickler.config import Settings
from tickler.scheduler import db
from tickler.scheduler.db import NoDatabase, create_engine
from tickler.scheduler.migrate import MigrationError, pending_migrations
from tickler.scheduler.store import Store

__all__ = ["NoDatabase", "existing_database_url", "open_store"]


def existing_database_url(settings: Settings) -> str:
    """The database URL, starting the embedded server only if its data already exists."""
    return db.existing_database_url(settings.database_url, settings.data_dir)


def open_store(settings: Settings) -> tuple[Store, Callable[[], None]]:
    """A store over the existing, migrated database, and a function that closes it."""
    url = existing_database_url(settings)
    try:
        pending = pending_migrations(url)
    except MigrationError as error:
        raise NoDatabase(str(error)) from None
    if pending:
        names = ", ".join(f"{m.version:04d}_{m.name}" for m in pending)
        raise NoDatabase(f"the database is not migrated yet ({names}); run `tickler migrate` first")
    engine = create_engine(url, pool_size=1)
    return Store(engine), engine.dispose
