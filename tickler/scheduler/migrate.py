"""Bring a database to this tickler's schema, recorded in a ledger.

Two kinds of step:
- the numbered files in `migrations/` move tables and data, once each, in order;
- the code files in `scheduler/database/` (functions, triggers, views) are applied again
  whenever their text changes, after the numbered steps, so that every function is defined in
  one place and edited there.

A new database skips the numbered steps: it gets `scheduler/database/schema.sql` (today's tables)
and the code files in one transaction, and the ledger records every numbered step as done.
tests/test_schema.py checks that both ways end in the same database.

A run holds a session advisory lock, so concurrent runs (N workers starting at once) queue up and
all but the first find nothing left to do. Each step runs in its own transaction together with its
ledger row: a step is applied entirely or not at all.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg

# psycopg alone: `tickler queues list` checks the migrations before it reads, and importing
# SQLAlchemy or structlog would be most of its start-up (the logger is taken when one is written).
from tickler.scheduler.connect import DEFAULT_CONNECT_TIMEOUT, connect, libpq_url


def _log() -> Any:
    import structlog

    return structlog.get_logger(__name__)


# pg_advisory_lock key for migration runs: the first 8 bytes of sha256("tickler.migrate").
MIGRATION_LOCK_KEY = int.from_bytes(hashlib.sha256(b"tickler.migrate").digest()[:8], "big", signed=True)

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

SCHEMA_FILE = "schema.sql"
# The code files in the order a new database needs them: a view or trigger of one file may call
# the functions of an earlier one (function bodies are not checked while they are applied).
CODE_FILES = (
    "counters.sql",
    "finishing.sql",
    "claiming.sql",
    "history.sql",
    "event_triggers.sql",
    "writing.sql",
    "operations_log.sql",
    "erasing.sql",
)

_LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS tickler_migration (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL,
    applied_on  timestamptz NOT NULL DEFAULT now()
);
-- Every text of a code file ever applied: the newest is what the database runs, and an older
-- one tells that the database has moved past the code that has it (see _check_code).
CREATE TABLE IF NOT EXISTS tickler_code_file (
    file        text NOT NULL,
    checksum    text NOT NULL,
    applied_on  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (file, checksum)
);
"""


class MigrationError(RuntimeError):
    """The database's history does not match the migration files."""


class _Text:
    """A step's SQL text and its checksum, which the ledger records."""

    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True)
class Migration(_Text):
    """A numbered step: tables and data."""

    version: int
    name: str
    sql: str

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


@dataclass(frozen=True)
class CodeFile(_Text):
    """A file of functions, triggers and views, applied again whenever it changes."""

    name: str
    sql: str

    @property
    def label(self) -> str:
        return self.name


Step = Migration | CodeFile


def available_migrations() -> list[Migration]:
    """Every numbered migration file shipped with tickler, in order."""
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


def _database_file(name: str) -> str:
    return resources.files("tickler.scheduler.database").joinpath(name).read_text(encoding="utf-8")


def code_files() -> list[CodeFile]:
    """The code files, in the order they are applied."""
    return [CodeFile(name, _database_file(name)) for name in CODE_FILES]


def schema_sql() -> str:
    """Today's tables, indexes, constraints and types (no functions: those are the code files)."""
    return _database_file(SCHEMA_FILE)


def _applied(conn: psycopg.Connection) -> dict[int, str]:
    exists = conn.execute("SELECT to_regclass('tickler_migration') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return {}
    return dict(conn.execute("SELECT version, checksum FROM tickler_migration").fetchall())


def _applied_code(conn: psycopg.Connection) -> dict[str, list[str]]:
    """Per code file, the checksums applied to the database, oldest first."""
    exists = conn.execute("SELECT to_regclass('tickler_code_file') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return {}
    applied: dict[str, list[str]] = {}
    for file, checksum in conn.execute("SELECT file, checksum FROM tickler_code_file ORDER BY applied_on, checksum"):
        applied.setdefault(file, []).append(checksum)
    return applied


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
            raise MigrationError(f"migration {migration.label} was changed after it was applied")
    return [m for m in migrations if m.version not in applied]


def _check_code(applied: dict[str, list[str]], files: list[CodeFile], *, allow_newer: bool = False) -> list[CodeFile]:
    """The code files to apply: those whose text the database never ran. A text it ran before
    another means a newer release applied its own since: with `allow_newer` that is no mismatch
    (its functions keep serving this code, as its migrations do), otherwise it is an error, so
    that an older `tickler migrate` never takes a newer release's functions back."""
    pending = []
    for file in files:
        history = applied.get(file.name, [])
        if file.checksum not in history:
            pending.append(file)
        elif history[-1] != file.checksum and not allow_newer:
            raise MigrationError(f"the database runs a newer {file.name} than this tickler's (newer release?)")
    return pending


def pending_migrations(
    url: str, *, allow_newer: bool = False, connect_timeout: int = DEFAULT_CONNECT_TIMEOUT
) -> list[Step]:
    """Steps not yet applied to the database at `url` (raises MigrationError on a mismatch).

    `allow_newer`: migrations after this code's newest are no mismatch. An upgrade migrates
    first, while the previous release still serves (docs/deploy.md): migrations only add what the
    running code can ignore, so that code stays ready, and a rollback of the code alone works."""
    with connect(libpq_url(url), autocommit=True, connect_timeout=connect_timeout) as conn:
        return pending_on(conn, allow_newer=allow_newer)


def pending_on(conn: psycopg.Connection, *, allow_newer: bool = False) -> list[Step]:
    """pending_migrations over an open connection."""
    steps: list[Step] = [*_check_history(_applied(conn), available_migrations(), allow_newer=allow_newer)]
    steps += _check_code(_applied_code(conn), code_files(), allow_newer=allow_newer)
    return steps


# A migration that takes locks while tickler runs may deadlock with a running statement; when
# PostgreSQL picks the migration as the one to fail, it is applied again (it is one transaction).
DEADLOCK_ATTEMPTS = 5


def _record(conn: psycopg.Connection, step: Step) -> None:
    if isinstance(step, Migration):
        conn.execute(
            "INSERT INTO tickler_migration (version, name, checksum) VALUES (%s, %s, %s)",
            [step.version, step.name, step.checksum],
        )
    else:
        conn.execute(
            "INSERT INTO tickler_code_file (file, checksum) VALUES (%s, %s)"
            " ON CONFLICT (file, checksum) DO UPDATE SET applied_on = now()",
            [step.name, step.checksum],
        )


def _apply(conn: psycopg.Connection, step: Step) -> None:
    for attempt in range(1, DEADLOCK_ATTEMPTS + 1):
        try:
            with conn.transaction():
                if isinstance(step, CodeFile):
                    # A function may call one defined in a later file; calls are resolved when it runs.
                    conn.execute("SET LOCAL check_function_bodies = off")
                conn.execute(step.sql.encode())
                _record(conn, step)
            return
        except psycopg.errors.DeadlockDetected:
            if attempt == DEADLOCK_ATTEMPTS:
                raise
            _log().warning("migration_deadlocked", step=step.label, attempt=attempt)


def _is_new(conn: psycopg.Connection) -> bool:
    row = conn.execute(
        "SELECT to_regclass('tickler_event') IS NULL AND NOT EXISTS (SELECT FROM tickler_migration)"
    ).fetchone()
    return bool(row and row[0])


def _install(conn: psycopg.Connection, migrations: list[Migration], files: list[CodeFile]) -> None:
    """A new database: today's schema and code in one transaction, every numbered step recorded."""
    with conn.transaction():
        conn.execute(schema_sql().encode())
        conn.execute("SET LOCAL check_function_bodies = off")
        for file in files:
            conn.execute(file.sql.encode())
        steps: list[Step] = [*migrations, *files]
        for step in steps:
            _record(conn, step)
        # Today's and the next days' partitions of history and the timeline.
        conn.execute("SELECT tickler_maintain_history()")


def pending_summary(steps: list[Step]) -> str:
    """A short description of pending steps, for one line of an error or of /readyz: the count
    and the first and last (a new database has dozens, which no one reads in a list)."""
    if len(steps) == 1:
        return f"1 step pending ({steps[0].label})"
    return f"{len(steps)} steps pending ({steps[0].label} … {steps[-1].label})"


def _may_not_migrate(conn: psycopg.Connection, pending: list[Step], error: psycopg.Error) -> MigrationError:
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return MigrationError(
        f"the database has {pending_summary(pending)}, which the role {conn.info.user} may not apply ({reason}): "
        "run `tickler migrate` as the schema's owner (docs/deploy.md), then start again"
    )


def migrate(
    url: str,
    *,
    through: int | None = None,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
    progress: Callable[[str], None] | None = None,
) -> list[Step]:
    """Apply every pending step; return those this call applied. `through`: only the numbered
    steps up to that version, and no code file (an upgrade test builds an earlier release's
    database this way). `progress` is told, in a line for people, each step as it is applied."""
    migrations = [m for m in available_migrations() if through is None or m.version <= through]
    files = code_files() if through is None else []
    say = progress or (lambda line: None)
    applied_now: list[Step] = []
    with connect(libpq_url(url), autocommit=True, connect_timeout=connect_timeout) as conn:
        # The ledger first, which reading needs no privilege beyond the service's: a role with data
        # privileges only starts on a migrated database (the ledger's CREATE TABLE IF NOT EXISTS
        # below needs CREATE on the schema even when the tables are there).
        pending: list[Step] = [*_check_history(_applied(conn), migrations)]
        pending += _check_code(_applied_code(conn), files)
        if not pending:
            return []
        try:
            conn.execute("SELECT pg_advisory_lock(%s)", [MIGRATION_LOCK_KEY])
            try:
                conn.execute(_LEDGER_DDL)
                if through is None and _is_new(conn):
                    say(
                        f"a new database: creating today's schema ({SCHEMA_FILE} and {len(files)} code files; "
                        f"{len(migrations)} numbered migrations recorded as done)"
                    )
                    started = time.monotonic()
                    _install(conn, migrations, files)
                    applied_now = [*migrations, *files]
                    say(f"  created the schema in {time.monotonic() - started:.2f} s")
                else:
                    # Again under the lock: a concurrent run may have applied some meanwhile.
                    pending = [*_check_history(_applied(conn), migrations)]
                    pending += _check_code(_applied_code(conn), files)
                    for step in pending:
                        kind = "migration" if isinstance(step, Migration) else "code file"
                        started = time.monotonic()
                        _apply(conn, step)
                        say(f"  applied {kind} {step.label} in {time.monotonic() - started:.2f} s")
                        _log().debug("migration_applied", step=step.label)
                        applied_now.append(step)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", [MIGRATION_LOCK_KEY])
        except psycopg.errors.InsufficientPrivilege as error:
            raise _may_not_migrate(conn, pending, error) from None
    if applied_now:
        # One line for a whole run (a first start applies them all), not one per step.
        first, last = applied_now[0].label, applied_now[-1].label
        _log().info("migrations_applied", count=len(applied_now), first=first, last=last)
    return applied_now
