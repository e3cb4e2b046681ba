"""Where the database is: an external PostgreSQL by URL, or an embedded one (pgserver) on disk."""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg.rows import dict_row, tuple_row
from sqlalchemy.engine import make_url

# The database is away (restarting, unreachable): loops back off and try again.
DATABASE_ERRORS = (sa.exc.OperationalError, sa.exc.InterfaceError)

EMBEDDED_DATABASE = "tickler"

_embedded_servers: dict[Path, Any] = {}
_embedded_lock = threading.Lock()


def sqlalchemy_url(url: str) -> str:
    """The URL with the psycopg 3 driver, whatever spelling (`postgres://`, `postgresql://`) it came in."""
    parsed = make_url(url)
    if parsed.drivername in ("postgres", "postgresql", "postgresql+psycopg"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    else:
        raise ValueError(f"not a PostgreSQL URL: {parsed.drivername}://...")
    return parsed.render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """The same URL as libpq (and so plain psycopg) spells it."""
    parsed = make_url(sqlalchemy_url(url)).set(drivername="postgresql")
    return parsed.render_as_string(hide_password=False)


def start_embedded(data_dir: Path) -> str:
    """Start (or join) the embedded PostgreSQL under `data_dir`; return the URL of tickler's database.

    pgserver counts the processes holding a server: `tickler serve` and a `tickler token create`
    run beside it share one server, and the last one to exit stops it. Data stays on disk.
    """
    data_dir = data_dir.expanduser().resolve()
    with _embedded_lock:
        server = _embedded_servers.get(data_dir)
        if server is None:
            data_dir.mkdir(parents=True, exist_ok=True)
            with warnings.catch_warnings():
                # platformdirs warns when XDG_RUNTIME_DIR is unset; pgserver then uses /tmp, which is fine.
                warnings.simplefilter("ignore")
                from pgserver import get_server

                server = get_server(data_dir / "pgdata", cleanup_mode="stop")
            _embedded_servers[data_dir] = server
    admin_url = server.get_uri()
    _ensure_database(admin_url, EMBEDDED_DATABASE)
    return str(server.get_uri(EMBEDDED_DATABASE))


def _ensure_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if exists:
            return
        # another tickler process may create it at the same moment
        with contextlib.suppress(psycopg.errors.DuplicateDatabase):
            conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))


def resolve_database_url(database_url: str, data_dir: Path) -> str:
    """The database to use: `database_url` when given, else the embedded one (started if needed)."""
    if database_url:
        return sqlalchemy_url(database_url)
    return sqlalchemy_url(start_embedded(data_dir))


class NoDatabase(Exception):
    """A command would reach a database that does not exist yet (see existing_database_url)."""


def embedded_data_exists(data_dir: Path) -> bool:
    """Whether an embedded PostgreSQL was ever initialised under `data_dir`."""
    return (data_dir.expanduser() / "pgdata" / "PG_VERSION").is_file()


def existing_database_url(database_url: str, data_dir: Path) -> str:
    """resolve_database_url, but never creating an embedded database that is not there yet.

    Every command but `serve` and `migrate` uses this: a mistyped TICKLER_DATA_DIR, or a command
    run from another directory, must say where it looked instead of quietly starting an empty
    database there.
    """
    if not database_url:
        where = data_dir.expanduser().resolve()
        if not embedded_data_exists(where):
            raise NoDatabase(
                f"no tickler database in {where} (looked for the embedded PostgreSQL's data in "
                f"{where / 'pgdata'}). Run this where `tickler serve` keeps its data, set "
                "TICKLER_DATA_DIR or TICKLER_DATABASE_URL, or create it with `tickler migrate`."
            )
    return resolve_database_url(database_url, data_dir)


# A pooled connection idle for longer than this is checked with a ping before it is handed out.
IDLE_PING_SECONDS = 10.0


def create_engine(url: str, *, pool_size: int = 10) -> sa.Engine:
    """An engine for tickler's store. Callers build it at start-up (never at import time)."""
    engine = sa.create_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_recycle=3600,
        connect_args={"application_name": "tickler"},
    )
    _ping_idle_connections(engine)
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


def unavailable_reason(error: BaseException) -> str | None:
    """Why the database could not serve a statement for now (read_only, disk_full, unreachable,
    ...), or None when the error is not the database being unavailable."""
    original = getattr(error, "orig", None) or error
    state = getattr(original, "sqlstate", None)
    if state in _UNAVAILABLE_SQLSTATES:
        return _UNAVAILABLE_SQLSTATES[state]
    if (state or "").startswith("08") or isinstance(
        error, sa.exc.OperationalError | sa.exc.InterfaceError | psycopg.OperationalError | psycopg.InterfaceError
    ):
        return "unreachable"
    return None


def driver_rows(engine: sa.Engine, statement: str, params: dict[str, Any], *, tuples: bool = False) -> list[Any]:
    """Run one statement in its own transaction (autocommit: one round trip) on a pooled
    connection's psycopg connection, prepared, its rows as dicts: for a hot path that needs none
    of SQLAlchemy's statement and result processing (`tuples`: rows as tuples). A driver error comes out as SQLAlchemy's
    (IntegrityError, OperationalError, ...), as from any other statement, and a connection that
    broke is dropped from the pool."""
    fairy = engine.raw_connection()
    try:
        conn: psycopg.Connection[Any] = fairy.driver_connection  # type: ignore[assignment]
        try:
            conn.autocommit = True
            try:
                with conn.cursor(row_factory=tuple_row if tuples else dict_row) as cursor:
                    cursor.execute(statement, params, prepare=True)
                    return cursor.fetchall()
            finally:
                if not conn.closed:
                    conn.autocommit = False
        except psycopg.Error as error:
            broken = conn.closed or isinstance(error, psycopg.OperationalError | psycopg.InterfaceError)
            if broken:
                fairy.invalidate(error)
            raise sa.exc.DBAPIError.instance(
                statement, params, error, psycopg.Error, connection_invalidated=broken
            ) from error
    finally:
        fairy.close()
