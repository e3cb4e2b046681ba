"""Reaching the database from a command, without creating one by mistake."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tickler.config import Settings
from tickler.scheduler.connect import NoDatabase

if TYPE_CHECKING:
    import psycopg

    from tickler.scheduler.store import Store

__all__ = ["NoDatabase", "existing_database_url", "open_reader", "open_store"]


def existing_database_url(settings: Settings) -> str:
    """The database URL, starting the embedded server only if its data already exists."""
    from tickler.scheduler import db

    return db.existing_database_url(settings.database_url, settings.data_dir)


def _check_migrated(conn: psycopg.Connection) -> None:
    from tickler.scheduler.migrate import MigrationError, pending_on, pending_summary

    try:
        pending = pending_on(conn)
    except MigrationError as error:
        raise NoDatabase(str(error)) from None
    if pending:
        raise NoDatabase(f"the database is not migrated: {pending_summary(pending)}; run `tickler migrate` first")


def open_store(settings: Settings) -> tuple[Store, Callable[[], None]]:
    """A store over the existing, migrated database, and a function that closes it."""
    from tickler.scheduler.connect import connect, existing_libpq_url
    from tickler.scheduler.db import create_engine
    from tickler.scheduler.replica import read_engines
    from tickler.scheduler.store import Store

    url = existing_libpq_url(settings.database_url, settings.data_dir)
    with connect(url, autocommit=True, connect_timeout=settings.connect_timeout) as conn:
        _check_migrated(conn)
    engine = create_engine(url, pool_size=1, connect_timeout=settings.connect_timeout)
    # the reads that may lag (`events list`, timelines) on TICKLER_READ_DATABASE_URL, as the API's
    reads = read_engines(engine, settings, pool_size=1)

    def close() -> None:
        reads.dispose()
        engine.dispose()

    return Store(engine, reads), close


def open_reader(settings: Settings, *, may_lag: bool = False) -> psycopg.Connection:
    """One plain psycopg connection (autocommit) to the existing, migrated database, for the
    read-only listings of scheduler/plain.py: no SQLAlchemy engine, no store. `may_lag`: a read
    that may lag (queue counts), on the replica of TICKLER_READ_DATABASE_URL while it is within
    TICKLER_READ_MAX_LAG_SECONDS and reachable, as the API's (scheduler/replica.py), else the primary."""
    from tickler.scheduler.connect import connect, existing_libpq_url

    if may_lag and settings.read_database_url:
        replica = _replica_reader(settings)
        if replica is not None:
            return replica
    url = existing_libpq_url(settings.database_url, settings.data_dir)
    conn = connect(url, autocommit=True, application_name="tickler", connect_timeout=settings.connect_timeout)
    try:
        _check_migrated(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _replica_reader(settings: Settings) -> psycopg.Connection | None:
    """A connection to the read replica when it answers within REPLICA_CONNECT_TIMEOUT, is close
    enough to the primary (its own measure: the replica_lag query) and has every migration; None
    (the primary then) otherwise: a listing never fails for the replica alone."""
    import psycopg

    from tickler.scheduler.connect import REPLICA_CONNECT_TIMEOUT, libpq_url
    from tickler.scheduler.migrate import MigrationError, pending_on
    from tickler.scheduler.plain import fetch

    timeout = REPLICA_CONNECT_TIMEOUT
    if settings.connect_timeout:
        timeout = min(timeout, settings.connect_timeout)
    try:
        conn = psycopg.connect(
            libpq_url(settings.read_database_url), autocommit=True, application_name="tickler", connect_timeout=timeout
        )
    except psycopg.OperationalError:
        return None
    try:
        [row] = fetch(conn, "replica_lag", {})
        lag = row["lag_seconds"]
        if lag is not None and float(lag) <= settings.read_max_lag_seconds and not pending_on(conn):
            return conn
    except (psycopg.Error, MigrationError):
        pass
    conn.close()
    return None
