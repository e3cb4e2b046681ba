"""`tickler queues list` and `tickler token list` start quickly: they read over one plain psycopg
connection (scheduler/plain.py) with the store's own named queries, and import neither SQLAlchemy
nor structlog nor Flask. The listing says what the store says. Here, what is imported (what
start-up costs moves with the machine)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import psycopg

from tickler.commands.database import open_reader
from tickler.config import Settings
from tickler.scheduler import plain
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.sql import driver_sql, pyformat, sources
from tickler.scheduler.store import Store

HEAVY = {"sqlalchemy", "structlog", "flask", "marshmallow", "pgserver", "prometheus_client"}


def _imports_of(argv: list[str], database_url: str, **env: str) -> tuple[int, str, list[str]]:
    program = (
        "import sys\nfrom tickler.cli import main\ntry:\n    code = main(sys.argv[1:])\n"
        "except SystemExit as exit:\n    code = exit.code\nsys.stdout.flush()\n"
        f"print('IMPORTED', sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(HEAVY)!r})))\n"
        "sys.exit(code)"
    )
    env = {**os.environ, "TICKLER_DATABASE_URL": database_url, **env}
    done = subprocess.run([sys.executable, "-c", program, *argv], env=env, capture_output=True, text=True, timeout=60)
    *lines, imported = done.stdout.splitlines()
    assert imported.startswith("IMPORTED "), done
    return done.returncode, "\n".join(lines), ast.literal_eval(imported.removeprefix("IMPORTED "))


def test_queues_list_imports_no_store_no_logging_and_no_app(
    database_url: str, make_queue: Callable[..., Queue]
) -> None:
    make_queue("emails")
    code, table, imported = _imports_of(["queues", "list"], database_url)
    assert code == 0 and table.splitlines()[1].split()[:3] == ["emails", "pull", "active"], table
    assert imported == []
    # with a read replica (here the same database: 0 s behind), its counts are read as plainly
    code, table, imported = _imports_of(["queues", "list"], database_url, TICKLER_READ_DATABASE_URL=database_url)
    assert code == 0 and table.splitlines()[1].split()[:3] == ["emails", "pull", "active"], table
    assert imported == []


def test_token_list_imports_no_store_either(database_url: str, store: Store) -> None:
    store.tokens.create("reporting", queues=["emails"], is_admin=False)
    code, table, imported = _imports_of(["token", "list"], database_url)
    header, *rows = table.splitlines()
    assert code == 0 and header.split() == ["ID", "NAME", "SCOPE", "CREATED", "LAST", "USED", "STATE"], table
    assert [row.split()[1:3] for row in rows] == [["reporting", "emails"]] and rows[0].endswith("active"), table
    assert imported == []


def test_the_other_commands_still_parse_without_the_store(database_url: str) -> None:
    """Building the parser (every subcommand's options) imports no store: `--help` of a command
    that does use the store costs nothing of it either."""
    code, text, imported = _imports_of(["events", "--help"], database_url)
    assert code == 0 and "list" in text and imported == []


def test_the_plain_listing_says_what_the_store_says(
    store: Store, settings: Settings, make_queue: Callable[..., Queue]
) -> None:
    emails = make_queue("emails", max_attempts=1)
    make_queue("idle")
    paused = make_queue("paused")
    store.queues.pause(paused.name)
    store.events.schedule_batch(emails, [NewEvent(f"k{i}", {}) for i in range(4)], actor="test")
    [lease, *_] = store.leases.claim(emails, worker="w", limit=2)
    store.leases.nack(lease.lease_id, error="boom")  # one attempt allowed: dead
    store.events.schedule_batch(paused, [NewEvent("later", {}, delay_seconds=3600)], actor="test")

    conn = open_reader(settings)
    with conn:
        listing = {row["name"]: row for row in plain.queue_listing(conn)}
    gauges = {g.name: g for g in store.queues.gauges()}
    queues = {q.name: q for q in store.queues.list()}
    assert list(listing) == ["emails", "idle", "paused"]
    for name, row in listing.items():
        expected = gauges[name]
        assert (row["delivery_mode"], row["paused"]) == (queues[name].delivery_mode, queues[name].paused)
        got = {k: row[k] for k in ("pending", "due", "in_flight", "dead")}
        assert got == {"pending": expected.pending, "due": expected.due, "in_flight": expected.in_flight,
                       "dead": expected.dead}  # fmt: skip
        assert abs(row["oldest_due_age_seconds"] - expected.oldest_due_age_seconds) < 60
    assert listing["emails"]["dead"] >= 1 and listing["paused"]["paused"] is True
    assert listing["idle"]["due"] == 0 and listing["idle"]["oldest_due_age_seconds"] == 0.0


def test_named_queries_keep_casts_percent_signs_and_escaped_colons(raw: psycopg.Connection[Any]) -> None:
    # As SQLAlchemy's text() reads them: `:b::text` is no parameter there either (the SQL files CAST).
    sql = r"SELECT CAST(:a AS int) + 1 AS n, :a::text AS t, '50%' AS p, '10\:30' AS c, 'x'::text AS x"
    expected = "SELECT CAST(%(a)s AS int) + 1 AS n, :a::text AS t, '50%%' AS p, '10:30' AS c, 'x'::text AS x"
    assert pyformat(sql) == expected
    row = raw.execute(pyformat(sql.replace(":a::text", "'y'::text")), {"a": 41}).fetchone()
    assert row == (42, "y", "50%", "10:30", "x")
    # Every named query of the package reads in psycopg's style as SQLAlchemy's text() reads it
    # (the `:name` parameters of the SQL files are text()'s).
    import sqlalchemy as sa
    from sqlalchemy.dialects.postgresql import psycopg as pg_psycopg

    dialect = pg_psycopg.dialect()  # type: ignore[no-untyped-call]
    for name, source in sources().items():
        assert driver_sql(name) == str(sa.text(source).compile(dialect=dialect)), name
