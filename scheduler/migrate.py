"""Apply the numbered SQL files in `migrations/`, once each, recorded in a ledger table.

A run holds a session advisory lock, so concurrent runs (N workers starting at once) queue up
and all but the first find nothing left to do. Each file runs in its own transaction together
with its ledger row: a file is applied entirely or not at all.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg

# psycopg alone: `tickler queues list` checks the migrations before it reads, and importing
# SQLAlchemy or structlog would be most of its start-up (the logger is taken when one is written).
from tickler.scheduler.connect import libpq_url


def _log() -> Any:
    import structlog

    return structlog.get_logger(__name__)


# pg_advisory_lock key for migration runs: the first 8 bytes of sha256("tickler.migrate").
MIGRATION_LOCK_KEY = int.from_bytes(hashlib.sha256(b"tickler.migrate").digest()[:8], "big", signed=True)

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS tickler_migration (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL,
    applied_on  timestamptz NOT NULL DEFAULT now()
)
"""


class MigrationError(RuntimeError):
    """The database's history does not match the migration files."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def available_migrations() -> list[Migration]:
    """Every migration file shipped with tickler, in order."""
    found = []
    for entry in resources.files("tickler.migrations").iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files share a number: {versions}")
    return found


def _applied(conn: psycopg.Connection) -> dict[int, str]:
    exists = conn.execute("SELECT to_regclass('tickler_migration') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return {}
    return dict(conn.execute("SELECT version, checksum FROM tickler_migration").fetchall())


def _check_history(
    applied: dict[int, str], migrations: list[Migration], *, allow_newer: bool = False
) -> list[Migration]:
    known = {m.version: m for m in migrations}
    newest_known = max(known, default=0)
    for version, checksum in applied.items():
        migration = known.get(version)
        if migration is None and allow_newer and version > newest_known:
            continue  # a newer release migrated ahead of this code (see pending_migrations)
        if migration is None:
            raise MigrationError(f"the database has migration {version}, which this tickler does not know (newer?)")
        if migration.checksum != checksum:
            raise MigrationError(f"migration {version}_{migration.name} was changed after it was applied")
    return [m for m in migrations if m.version not in applied]


def pending_migrations(url: str, *, allow_newer: bool = False) -> list[Migration]:
    """Migrations not yet applied to the database at `url` (raises MigrationError on a mismatch).

    `allow_newer`: migrations after this code's newest are no mismatch. An upgrade migrates
    first, while the previous release still serves (docs/deploy.md): migrations only add what the
    running code can ignore, so that code stays ready, and a rollback of the code alone works."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        return pending_on(conn, allow_newer=allow_newer)


def pending_on(conn: psycopg.Connection, *, allow_newer: bool = False) -> list[Migration]:
    """pending_migrations over an open connection."""
    return _check_history(_applied(conn), available_migrations(), allow_newer=allow_newer)


# A migration that takes locks while tickler runs may deadlock with a running statement; when
# PostgreSQL picks the migration as the one to fail, it is applied again (it is one transaction).
DEADLOCK_ATTEMPTS = 5


def _apply(conn: psycopg.Connection, migration: Migration) -> None:
    for attempt in range(1, DEADLOCK_ATTEMPTS + 1):
        try:
            with conn.transaction():
                conn.execute(migration.sql.encode())
                conn.execute(
                    "INSERT INTO tickler_migration (version, name, checksum) VALUES (%s, %s, %s)",
                    [migration.version, migration.name, migration.checksum],
                )
            return
        except psycopg.errors.DeadlockDetected:
            if attempt == DEADLOCK_ATTEMPTS:
                raise
            _log().warning("migration_deadlocked", version=migration.version, attempt=attempt)


def migrate(url: str, *, through: int | None = None) -> list[Migration]:
    """Apply every pending migration (up to version `through`, when given: an upgrade test builds
    the schema of an earlier release); return those this call applied."""
    migrations = [m for m in available_migrations() if through is None or m.version <= through]
    applied_now: list[Migration] = []
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", [MIGRATION_LOCK_KEY])
        try:
            conn.execute(_LEDGER_DDL)
            for migration in _check_history(_applied(conn), migrations):
                _apply(conn, migration)
                _log().debug("migration_applied", version=migration.version, name=migration.name)
                applied_now.append(migration)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", [MIGRATION_LOCK_KEY])
    if applied_now:
        # One line for a whole run (a first start applies them all), not one per file.
        last = applied_now[-1]
        _log().info("migrations_applied", count=len(applied_now), first=applied_now[0].version, last=last.version)
    return applied_now
