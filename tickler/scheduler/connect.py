"""Reaching the database with psycopg alone: the URL as libpq spells it, and the embedded server.

No SQLAlchemy here (importing it is most of a short command's start-up): the command line's
read-only listings connect through this module, and scheduler/db.py builds the store's engine on
top of it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import psycopg
import psycopg.sql

from tickler.config.database_url import parse as parse_database_url

EMBEDDED_DATABASE = "tickler"

# How long a new connection may take (seconds; libpq's connect_timeout) unless the caller says:
# Settings.connect_timeout (TICKLER_CONNECT_TIMEOUT) is what the service and the commands pass.
DEFAULT_CONNECT_TIMEOUT = 10

# A read replica that does not answer a new connection within this many seconds is "unreachable":
# the reads that may lag go to the primary meanwhile (a request must not wait for a replica that
# is gone). scheduler/replica.py's engines and the command line's plain reads alike.
REPLICA_CONNECT_TIMEOUT = 2

_log = logging.getLogger("tickler.database")

_embedded_servers: dict[Path, Any] = {}
_embedded_lock = threading.Lock()


class NoDatabase(Exception):
    """A command would reach a database that does not exist yet (see existing_database_url)."""


# An install may leave the embedded PostgreSQL out (the container image removes pgserver).
NO_EMBEDDED = (
    "TICKLER_DATABASE_URL is not set and the embedded PostgreSQL is not installed: set TICKLER_DATABASE_URL "
    "to your PostgreSQL, or install the embedded one (pip install pgserver)"
)


def libpq_url(url: str) -> str:
    """The database as libpq's URL (plain psycopg takes it), whatever spelling it came in, every
    host of a list kept (config.database_url reads them all). ValueError for one it cannot read."""
    return parse_database_url(url).libpq_url()


# What PostgreSQL answers while it starts, stops or replays WAL (SQLSTATE 57P03,
# cannot_connect_now): the server is there and will take connections in a moment.
_NOT_YET = (
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "the database system is not accepting connections",
)


def connect(url: str, *, connect_timeout: int = DEFAULT_CONNECT_TIMEOUT, **kwargs: Any) -> psycopg.Connection:
    """psycopg.connect, riding out a server that is restarting.

    A process started while PostgreSQL restarts (a deploy, a failover) would otherwise stop at
    once with "the database system is shutting down". Once the server has said it is not ready,
    every failure is retried, through the moment its socket is gone, for up to `connect_timeout`
    seconds (10 when it is 0, libpq's "no limit"). A server that refuses from the first try (a
    wrong port, a wrong password, no such database) raises at once: a mistake is said in a second.
    """
    deadline = time.monotonic() + (connect_timeout or DEFAULT_CONNECT_TIMEOUT)
    pause = 0.1
    restarting = False
    while True:
        try:
            return psycopg.connect(url, connect_timeout=connect_timeout, **kwargs)
        except psycopg.OperationalError as error:
            restarting = restarting or any(reason in str(error) for reason in _NOT_YET)
            if not restarting or time.monotonic() + pause > deadline:
                raise
            _log.warning("database_not_ready: %s; trying again in %.1f s", _reason(error), pause)
        time.sleep(pause)  # the server is restarting; there is nothing to wait on but time
        pause = min(pause * 2, 1.0)


def _reason(error: Exception) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return first.rsplit(" failed: ", 1)[-1].removeprefix("FATAL:").strip()


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
                try:
                    from pgserver import get_server
                except ImportError:
                    raise NoDatabase(NO_EMBEDDED) from None

                _forget_dead_holders(data_dir / "pgdata")
                server = get_server(data_dir / "pgdata", cleanup_mode="stop")
            _embedded_servers[data_dir] = server
    admin_url = server.get_uri()
    _ensure_database(admin_url, EMBEDDED_DATABASE)
    return str(server.get_uri(EMBEDDED_DATABASE))


def _forget_dead_holders(pgdata: Path) -> None:
    """Strike from pgserver's list of the processes holding the server those that are gone.

    pgserver stops the server when the last process on its list exits, and each removes itself
    at exit. A process that could not (killed, or ended by a signal without cleaning up) stays on
    the list for ever, and then no later exit is the last one: the server would outlive every
    tickler. A process that is not running holds nothing."""
    import psutil
    from pgserver.postgres_server import PostgresServer
    from pgserver.utils import DiskList

    holders = DiskList(pgdata / ".handle_pids.json")
    with PostgresServer._lock:  # the lock pgserver takes around the same list
        if not holders.path.exists():
            return
        pids = holders.get()
        living = [pid for pid in pids if _running(psutil, pid)]
        if living != pids:
            holders.put(living)


def _running(psutil: Any, pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # someone else's process, alive


def _ensure_database(admin_url: str, name: str) -> None:
    with connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if exists:
            return
        # another tickler process may create it at the same moment
        with contextlib.suppress(psycopg.errors.DuplicateDatabase):
            conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))


def embedded_data_exists(data_dir: Path) -> bool:
    """Whether an embedded PostgreSQL was ever initialised under `data_dir`."""
    return (data_dir.expanduser() / "pgdata" / "PG_VERSION").is_file()


def existing_libpq_url(database_url: str, data_dir: Path) -> str:
    """The database's URL (libpq's spelling), never creating an embedded database that is not there.

    Every command but `serve` and `migrate` uses this: a mistyped TICKLER_DATA_DIR, or a command
    run from another directory, must say where it looked instead of quietly starting an empty
    database there.
    """
    if database_url:
        return libpq_url(database_url)
    where = data_dir.expanduser().resolve()
    if not embedded_data_exists(where):
        raise NoDatabase(
            f"no tickler database in {where} (looked for the embedded PostgreSQL's data in "
            f"{where / 'pgdata'}). Run this where `tickler serve` keeps its data, set "
            "TICKLER_DATA_DIR or TICKLER_DATABASE_URL, or create it with `tickler migrate`."
        )
    return libpq_url(start_embedded(data_dir))
