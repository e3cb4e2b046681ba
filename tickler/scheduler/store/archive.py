"""Where a key's archived history went: the archive job records it (tickler_archived_key) when it
deletes a run's rows; the timeline endpoint reads it to point its readers there."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from tickler.scheduler.db import driver_rows
from tickler.scheduler.rules import format_timestamp
from tickler.scheduler.sql import pyformat

# Kept beside its only caller: it reads the archive's tables (migrations/0003_archive.sql).
_ARCHIVED_HISTORY = pyformat(
    """
    SELECT k.archived_through, k.events, k.archive_id, k.first_archive_id, r.location
    FROM tickler_archived_key AS k
    JOIN tickler_archive_run AS r ON r.id = k.archive_id
    WHERE k.queue = :queue AND k.item_key = :item_key
    """
)


def archived_history(engine: sa.Engine, queue: str, item_key: str) -> dict[str, Any] | None:
    """Where the archived part of a key's timeline is, or None when none of it was archived.

    Returns {"location", "timeline", "archived_through", "archived_events", "archive_id",
    "first_archive_id"}: `timeline` is the Parquet directory of the key's queue under the
    archive's root (rows of runs `first_archive_id` to `archive_id`, column `run`; filter on item_key),
    `archived_through` the latest finish time (RFC 3339) among its archived events.
    """
    rows = driver_rows(engine, _ARCHIVED_HISTORY, {"queue": queue, "item_key": item_key})
    if not rows:
        return None
    row = rows[0]
    return {
        "location": row["location"],
        "timeline": f"{row['location']}/timeline/queue={queue}",
        "archived_through": format_timestamp(row["archived_through"]),
        "archived_events": int(row["events"]),
        "archive_id": int(row["archive_id"]),
        "first_archive_id": int(row["first_archive_id"]),
    }
