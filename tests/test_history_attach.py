"""Creating a day's partition while a writer puts a row of that day into the default partition.

A row of a day that has no partition yet goes to the default partition. Creating the day's
partition moves such rows out of the default one and then attaches the new table; a row that a
writer committed between the move and the attach made PostgreSQL refuse the attach ("updated
partition constraint for default partition would be violated"). Migration 0031 locks the default
partition first, so such a writer either commits before the move (its row is moved) or waits
until the partition exists (its row goes there)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from tests.helpers_wait import wait_until
from tests.pg import libpq_url


def lock_waiters(raw: psycopg.Connection[Any], pid: int) -> bool:
    row = raw.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", [pid]).fetchone()
    return bool(row and row[0])


def test_a_row_committed_while_the_partition_is_created_lands_in_it(database_url: str) -> None:
    url = libpq_url(database_url)
    day = (datetime.now(UTC) + timedelta(days=20)).date()
    at = datetime(day.year, day.month, day.day, 9, tzinfo=UTC)
    with (
        psycopg.connect(url, autocommit=True) as raw,
        psycopg.connect(url) as writer,
        psycopg.connect(url, autocommit=True) as maintainer,
    ):
        raw.execute(
            "INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor)"
            " VALUES ('q', 'before', 1, %s, 'enqueued', 'app')",
            [at],
        )
        # A writer's row of that day, not yet committed, while the partition is being created.
        writer.execute(
            "INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor)"
            " VALUES ('q', 'racing', 2, %s, 'enqueued', 'app')",
            [at],
        )
        outcome: dict[str, Any] = {}

        def create_partition() -> None:
            try:
                row = maintainer.execute("SELECT tickler_add_history_day('tickler_timeline', %s)", [day]).fetchone()
                outcome["created"] = row[0] if row else None
            except psycopg.Error as error:
                outcome["error"] = error

        maintainer_pid = maintainer.info.backend_pid
        thread = threading.Thread(target=create_partition)
        thread.start()
        wait_until(lambda: lock_waiters(raw, maintainer_pid), what="the partition's creation waiting for the writer")
        writer.commit()
        thread.join(timeout=30)

        assert not thread.is_alive()
        assert "error" not in outcome, outcome.get("error")
        partition = f"tickler_timeline_{day:%Y%m%d}"
        assert outcome["created"][0] == partition  # then its parts, one per retention class of the queues
        in_partition = raw.execute(f"SELECT item_key FROM {partition} ORDER BY item_key").fetchall()
        assert [k for (k,) in in_partition] == ["before", "racing"]
        day_start = at - timedelta(hours=9)
        left_in_default = raw.execute(
            "SELECT count(*) FROM tickler_timeline_default WHERE at >= %s AND at < %s",
            [day_start, day_start + timedelta(days=1)],
        ).fetchone()
        assert left_in_default == (0,)
        raw.execute(f"DROP TABLE {partition}")
        raw.execute("DELETE FROM tickler_history_partition WHERE %s IN (name, day_table)", [partition])
