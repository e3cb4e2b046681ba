"""Where the database is: an external PostgreSQL by URL, or an embedded one (pgserver) on disk;
the engine whose pool holds its connections; and the one translation of the driver's errors.

A named query runs one way (sql.run on a psycopg connection): alone with driver_rows, or in a
transaction of driver_connection, on a connection of the engine's pool; so does a query built with
SQLAlchemy Core (store/search.py's statement() gives its text and parameters). SQLAlchemy is the
pool (and the disconnect and stale-statement handling around it), not the way statements run."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import make_url

# Reaching the database without SQLAlchemy lives in connect.py; its names are the store's too.
from tickler.scheduler.connect import (
    DEFAULT_CONNECT_TIMEOUT,
    EMBEDDED_DATABASE,
    NoDatabase,
    embedded_data_exists,
    existing_libpq_url,
    libpq_url,
    start_embedded,
)
from tickler.scheduler.sql import run

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "EMBEDDED_DATABASE",
    "NoDatabase",
    "embedded_data_exists",
    "libpq_url",
    "start_embedded",
]

# The database is away (restarting, unreachable): loops back off and try again.
DATABASE_ERRORS = (sa.exc.OperationalError, sa.exc.InterfaceError)


def sqlalchemy_url(url: str) -> str:
    """The URL with the psycopg 3 driver, whatever spelling (`postgres://`, `postgresql://`) it came in."""
    parsed = make_url(url)
    if parsed.drivername in ("postgres", "postgresql", "postgresql+psycopg"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    else:
        raise ValueError(f"not a PostgreSQL URL: {parsed.drivername}://...")
    return parsed.render_as_string(hide_password=False)


def resolve_database_url(database_url: str, data_dir: Path) -> str:
    """The database to use: `database_url` when given, else the embedded one (started if needed)."""
    if database_url:
        return sqlalchemy_url(database_url)
    return sqlalchemy_url(start_embedded(data_dir))


def existing_database_url(database_url: str, data_dir: Path) -> str:
    """resolve_database_url, but never creating an embedded database that is not there yet
    (connect.existing_libpq_url says why), in SQLAlchemy's spelling."""
    return sqlalchemy_url(existing_libpq_url(database_url, data_dir))


# A pooled connection idle for longer than this is checked with a ping before it is handed out.
IDLE_PING_SECONDS = 10.0


def create_engine(url: str, *, pool_size: int = 10, connect_timeout: int = DEFAULT_CONNECT_TIMEOUT) -> sa.Engine:
    """An engine for tickler's store. Callers build it at start-up (never at import time).
    `connect_timeout`: seconds a new pooled connection may take (Settings.connect_timeout)."""
    engine = sa.create_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_recycle=3600,
        connect_args={"application_name": "tickler", "connect_timeout": connect_timeout},
    )
    _ping_idle_connections(engine)
    _drop_stale_prepared_statements(engine)
    return engine


def _ping_idle_connections(engine: sa.Engine) -> None:
    """Ping a pooled connection on checkout only when it sat idle: a ping on every checkout
    (pool_pre_ping) costs a round trip per request, while connections that died while in use are
    already discarded by SQLAlchemy's disconnect handling (which also drops the rest of the pool)."""

    @sa.event.listens_for(engine, "checkin")
    def _checked_in(dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < IDLE_PING_SECONDS:
            return
        try:
            with dbapi_connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            if not dbapi_connection.autocommit:
                dbapi_connection.rollback()
        except psycopg.Error:
            raise sa.exc.DisconnectionError() from None  # the pool retries with a new connection


def _drop_stale_prepared_statements(engine: sa.Engine) -> None:
    """A statement that fails because a migration made it stale (stale_prepared_statement) is
    handled as a lost connection: SQLAlchemy drops the connection and the rest of the pool, whose
    connections prepared the same statements, and the next statements run on new connections.
    The failing call itself answers "try again" (unavailable_reason: `schema_changed`)."""

    @sa.event.listens_for(engine, "handle_error")
    def _stale(context: sa.engine.ExceptionContext) -> None:
        if stale_prepared_statement(context.original_exception):
            context.is_disconnect = True


def stale_prepared_statement(error: BaseException) -> bool:
    """Whether PostgreSQL refused a prepared statement because the row type it returns changed
    since it was prepared ("cached plan must not change result type"): a migration added a column
    to a table whose whole rows (`e.*`, a row of its type) the statement returns. psycopg prepares
    the statements a connection runs often, so a process that was running when such a migration
    ran meets this once per connection and statement; the statement itself is fine on a new
    connection. Told by SQLSTATE and the server function that raises it, not by the message,
    which the server may translate."""
    original = getattr(error, "orig", None) or error
    if getattr(original, "sqlstate", None) != "0A000":  # feature_not_supported
        return False
    diag = getattr(original, "diag", None)
    return getattr(diag, "source_function", None) == "RevalidateCachedQuery"


# SQLSTATEs that say "the database cannot take this now", not "this request is wrong": the
# same request succeeds once the database is back (or writable again).
_UNAVAILABLE_SQLSTATES = {
    "25006": "read_only",  # read_only_sql_transaction: a hot standby, or default_transaction_read_only
    "53100": "disk_full",
    "53200": "out_of_memory",
    "53300": "too_many_connections",
    "57P01": "shutting_down",  # admin_shutdown
    "57P02": "shutting_down",  # crash_shutdown
    "57P03": "starting_up",  # cannot_connect_now
    "40001": "serialization_failure",
    "40P01": "deadlock",
}


# The server's refusal of a new connection when its slots are taken (FATAL 53300, reported to the
# client as a message only).
_TOO_MANY_CLIENTS = re.compile(r"too many clients|remaining connection slots are reserved")


def unavailable_reason(error: BaseException) -> str | None:
    """Why the database could not serve a statement for now (read_only, disk_full, unreachable,
    ...), or None when the error is not the database being unavailable."""
    if isinstance(error, sa.exc.TimeoutError):
        return "busy"  # every pooled connection stayed in use for as long as the pool waits
    original = getattr(error, "orig", None) or error
    state = getattr(original, "sqlstate", None)
    if state in _UNAVAILABLE_SQLSTATES:
        return _UNAVAILABLE_SQLSTATES[state]
    if _TOO_MANY_CLIENTS.search(str(original)):
        return "too_many_connections"  # refused at connect: no SQLSTATE reaches the client
    if stale_prepared_statement(error):
        return "schema_changed"  # its connection was dropped: the same call works again
    if (state or "").startswith("08") or isinstance(
        error, sa.exc.OperationalError | sa.exc.InterfaceError | psycopg.OperationalError | psycopg.InterfaceError
    ):
        return "unreachable"
    return None


def driver_error(
    error: psycopg.Error, statement: str | None, params: Mapping[str, Any] | None, *, invalidated: bool = False
) -> sa.exc.StatementError:
    """A driver error as SQLAlchemy's (OperationalError, IntegrityError, ...), as any statement
    run through SQLAlchemy raises it: what the API's error handlers and unavailable_reason read.
    The one translation of the driver's errors: every statement runs on a connection of the
    engine's pool through driver_connection (a statement run through SQLAlchemy itself has its
    errors translated by SQLAlchemy)."""
    return sa.exc.DBAPIError.instance(
        statement, None if params is None else dict(params), error, psycopg.Error, connection_invalidated=invalidated
    )


@contextmanager
def driver_connection(
    engine: sa.Engine,
    statement: str | None = None,
    params: Mapping[str, Any] | None = None,
    *,
    autocommit: bool = False,
) -> Iterator[psycopg.Connection[Any]]:
    """A pooled connection's psycopg connection, on which the block runs named queries with
    sql.run: in one transaction, committed when the block ends (or, with `autocommit`, each
    statement its own: one round trip). A driver error comes out as SQLAlchemy's
    (IntegrityError, OperationalError, ...) for `statement` and `params` (the block's main
    statement, named in the error's message), as from any other statement, after the
    transaction is rolled back; a connection that broke is dropped from the pool. So does a
    connection the server refuses to open (too many clients, starting up, unreachable): the pool
    opens connections with the driver, outside SQLAlchemy's translation of the statements it runs."""
    try:
        fairy = engine.raw_connection()
    except psycopg.Error as error:
        raise driver_error(error, statement, params) from error
    try:
        conn: psycopg.Connection[Any] = fairy.driver_connection  # type: ignore[assignment]
        try:
            if autocommit:
                conn.autocommit = True
            try:
                yield conn
                if not autocommit:
                    conn.commit()
            finally:
                if autocommit and not conn.closed:
                    conn.autocommit = False
        except psycopg.Error as error:
            broken = (
                conn.closed
                or isinstance(error, psycopg.OperationalError | psycopg.InterfaceError)
                or stale_prepared_statement(error)  # its prepared statements are stale
            )
            if not autocommit and not conn.closed:
                try:
                    conn.rollback()
                except psycopg.Error:
                    broken = True
            if broken:
                fairy.invalidate(error)
            raise driver_error(error, statement, params, invalidated=broken) from error
    finally:
        fairy.close()


def driver_rows(
    engine: sa.Engine,
    statement: str,
    params: Mapping[str, Any] | None = None,
    *,
    tuples: bool = False,
    prepare: bool | None = True,
) -> list[Any]:
    """Run one statement (sql.driver_sql(name)) in its own transaction (autocommit) on a pooled
    connection (driver_connection), prepared (`prepare`: as sql.run takes it), its rows as dicts
    (`tuples`: as tuples): sql.run.
    A statement that a migration made stale on its connection (stale_prepared_statement: refused
    before it ran, so nothing was done) runs again once, on a new connection: the pool's idle
    connections, which prepared the same statements, are closed first (as SQLAlchemy does for its
    own statements, see _drop_stale_prepared_statements)."""
    params = params or {}
    for attempt in (1, 2):
        try:
            with driver_connection(engine, statement, params, autocommit=True) as conn:
                return run(conn, statement, params, tuples=tuples, prepare=prepare)
        except sa.exc.DBAPIError as error:
            if attempt == 2 or not stale_prepared_statement(error):
                raise
            engine.dispose()  # a new pool; connections in use elsewhere leave with their users
    raise AssertionError("unreachable")
