"""Read-only queries over one plain psycopg connection, for the command line's listings.

The same named queries as the store (scheduler/*.sql), run the same way (sql.run), over the
command's own connection instead of the engine's pool: no SQLAlchemy, whose import is most of a
short command's start-up (`tickler queues list` reads two queries and exits).
"""

from __future__ import annotations

from typing import Any

import psycopg

from tickler.scheduler.sql import driver_sql, run


def fetch(conn: psycopg.Connection, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of the named query, as dicts (sql.run, as the store runs it; not prepared: a
    command runs each query once)."""
    return run(conn, driver_sql(name), params, prepare=None)


def gauge_values(row: dict[str, Any]) -> dict[str, Any]:
    """A queue_gauges row's counts, and the age of its oldest due event (0 when none is due)."""
    oldest = row["oldest_due"]
    return {
        "pending": int(row["open"]) - int(row["in_flight"]),
        "due": int(row["due"]),
        "in_flight": int(row["in_flight"]),
        "dead": int(row["dead"]),
        "oldest_due_age_seconds": max(0.0, (row["db_now"] - oldest).total_seconds()) if oldest is not None else 0.0,
    }


def queue_listing(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every queue by name (name, delivery_mode, paused) with its gauges (gauge_values), as
    QueueStore.list and gauges() read them; the gauges None for a queue created between the reads."""
    gauges = {row["name"]: gauge_values(row) for row in fetch(conn, "queue_gauges", {"names": None, "now": None})}
    empty = dict.fromkeys(("pending", "due", "in_flight", "dead", "oldest_due_age_seconds"))
    return [
        {"name": q["name"], "delivery_mode": q["delivery_mode"], "paused": q["paused"], **gauges.get(q["name"], empty)}
        for q in fetch(conn, "list_queues", {"names": None})
    ]
