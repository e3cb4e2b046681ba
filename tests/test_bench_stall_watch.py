"""The soak's stall watch (bench/stall_watch.py): what it groups as a stall, and that its samples
name a statement of the database that has been waiting for more than half a second."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from bench.stall_watch import StallWatch, stalls
from tests.helpers_wait import wait_until


def test_late_events_within_two_seconds_of_each_other_are_one_stall() -> None:
    seen = [(10.0, 0.01), (11.0, 1.5), (12.5, 3.0), (13.0, 0.2), (20.0, 1.1), (40.0, 0.5)]
    assert stalls(seen) == [(11.0, 12.5, 2), (20.0, 20.0, 1)]
    assert stalls(seen, threshold=5.0) == []


def test_the_watch_names_a_statement_that_waits(database_url: str, raw: psycopg.Connection[Any]) -> None:
    raw.execute("CREATE TABLE watched (n integer)")
    holder = psycopg.connect(database_url)
    holder.execute("LOCK TABLE watched IN ACCESS EXCLUSIVE MODE")  # held until rollback below
    waiter_done = threading.Event()

    def wait_for_the_lock() -> None:
        with psycopg.connect(database_url, autocommit=True) as waiter:
            waiter.execute("SELECT count(*) FROM watched")
        waiter_done.set()

    waiter = threading.Thread(target=wait_for_the_lock)
    with StallWatch(database_url, interval=0.1) as watch:
        waiter.start()
        try:
            line = wait_until(
                lambda: next((s for s in watch.around(0, 2e10, margin=0) if "SELECT count(*) FROM watched" in s), None),
                what="a sample naming the waiting statement",
            )
        finally:
            holder.rollback()
            holder.close()
            waiter.join(10)
    assert waiter_done.is_set()
    assert "client backend Lock/relation" in line
