"""Real PostgreSQL for the tests: the embedded server (default) or TICKLER_TEST_DATABASE_URL."""

from __future__ import annotations

import fcntl
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import sql

from tickler.scheduler.db import create_engine, libpq_url
from tickler.scheduler.migrate import migrate

# As root, pgserver runs PostgreSQL as the system user `pgserver`, which it creates with useradd
# when missing. On a fresh machine the test workers start their servers at once: two useradd runs
# then race, the user ends with another uid than the one a data directory was given to, and
# initdb fails ("could not change permissions of directory"). One start at a time, machine-wide.
_START_LOCK = Path(tempfile.gettempdir()) / "tickler-test-pgserver.lock"


def embedded_server(directory: Path) -> Any:
    """pgserver.get_server(directory), deleted on cleanup, one start at a time on this machine."""
    with warnings.catch_warnings(), _START_LOCK.open("a") as lock:
        warnings.simplefilter("ignore")
        import pgserver

        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return pgserver.get_server(directory, cleanup_mode="delete")


def start_embedded_server(directory: Path) -> str:
    """Start a throwaway embedded PostgreSQL tuned for tests; return its admin URL."""
    server = embedded_server(directory)
    url = str(server.get_uri())
    with psycopg.connect(url, autocommit=True) as conn:
        # Durability is not what these tests check; speed is welcome (this server is thrown away).
        conn.execute("ALTER SYSTEM SET fsync = off")
        conn.execute("ALTER SYSTEM SET synchronous_commit = off")
        conn.execute("ALTER SYSTEM SET full_page_writes = off")
        conn.execute("ALTER SYSTEM SET max_connections = 200")
        conn.execute("SELECT pg_reload_conf()")
    _servers.append(server)
    return url


_servers: list[object] = []


def stop_embedded_server() -> None:
    """Stop the servers this process started (pgserver stops one when its last handle goes)."""
    while _servers:
        server = _servers.pop()
        server.cleanup()  # type: ignore[attr-defined]


def with_database(url: str, name: str) -> str:
    """`url` pointing at database `name` instead."""
    from sqlalchemy.engine import make_url

    return make_url(libpq_url(url)).set(database=name).render_as_string(hide_password=False)


def create_database(admin_url: str, prefix: str = "tickler_test") -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_database(admin_url, name)


def drop_database(admin_url: str, database_url: str) -> None:
    from sqlalchemy.engine import make_url

    name = make_url(database_url).database
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def own_database(admin_url: str, prefix: str) -> Iterator[str]:
    """A database of its own, named after `prefix`, dropped on the way out; yields its URL."""
    url = create_database(admin_url, prefix)
    try:
        yield url
    finally:
        drop_database(admin_url, url)


@contextmanager
def migrated_database(
    admin_url: str, prefix: str, *, through: int | None = None, pool_size: int = 3
) -> Iterator[tuple[str, sa.Engine, psycopg.Connection[Any]]]:
    """A database of its own, migrated (`through`: only up to that numbered migration, the schema
    of an earlier release); yields its URL, an engine of `pool_size` connections and an autocommit
    connection, all closed and the database dropped on the way out."""
    with own_database(admin_url, prefix) as url:
        migrate(url, through=through)
        engine = create_engine(url, pool_size=pool_size)
        try:
            with psycopg.connect(libpq_url(url), autocommit=True) as raw:
                yield url, engine, raw
        finally:
            engine.dispose()
