"""The hot tables' planner statistics are gathered by the dispatchers when a table that was never
analyzed fills up, or grows past four times the size its statistics were taken at
(scheduler/statistics.py): without them a claim's plan reads every open event."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests import pg
from tests.helpers_wait import wait_until
from tests.helpers_worker import recording_worker
from tickler.config import Settings
from tickler.scheduler.db import create_engine, libpq_url
from tickler.scheduler.migrate import migrate
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.sql import driver_sql
from tickler.scheduler.statistics import GROWTH, MIN_PAGES, StatisticsKeeper
from tickler.scheduler.store import QueueSettings, Store


@pytest.fixture
def fresh(admin_url: str) -> Iterator[tuple[str, Store, psycopg.Connection[Any]]]:
    """A database of its own, just migrated: its tables were never analyzed. Autovacuum is off
    for the hot tables, so that only the code under test analyzes them."""
    url = pg.create_database(admin_url, prefix="tickler_stats")
    migrate(url)
    engine = create_engine(url, pool_size=2)
    try:
        with psycopg.connect(libpq_url(url), autocommit=True) as raw:
            raw.execute("ALTER TABLE tickler_event SET (autovacuum_enabled = off)")
            raw.execute("ALTER TABLE tickler_lease SET (autovacuum_enabled = off)")
            yield url, Store(engine), raw
    finally:
        engine.dispose()
        pg.drop_database(admin_url, url)


def schedule(store: Store, queue: Queue, count: int, *, start: int = 0, delay_seconds: float = 3600) -> None:
    for first in range(start, start + count, 5_000):
        store.events.schedule_batch(
            queue,
            [
                NewEvent(item_key=f"k{i}", data={}, delay_seconds=delay_seconds)
                for i in range(first, min(first + 5_000, start + count))
            ],
            actor="load",
        )


def analyzed(raw: psycopg.Connection[Any], table: str) -> tuple[float, int]:
    """The table's row and page counts as its last ANALYZE (or VACUUM) left them (-1 rows: never)."""
    row = raw.execute("SELECT reltuples, relpages FROM pg_class WHERE oid = to_regclass(%s)", [table]).fetchone()
    assert row is not None
    return float(row[0]), int(row[1])


def test_a_table_never_analyzed_is_analyzed_once_it_holds_events(
    fresh: tuple[str, Store, psycopg.Connection[Any]],
) -> None:
    _, store, raw = fresh
    queue = store.queues.put("emails", QueueSettings(), Settings()).queue
    keeper = StatisticsKeeper(store)
    schedule(store, queue, 100)
    assert keeper.run() == []  # a few pages: any plan reads little, left to autovacuum
    assert analyzed(raw, "tickler_event")[0] < 0

    schedule(store, queue, 5_000, start=100)
    assert keeper.run() == ["tickler_event"]
    rows, pages = analyzed(raw, "tickler_event")
    assert rows == pytest.approx(5_100, rel=0.05) and pages >= MIN_PAGES
    assert keeper.run() == []  # nothing new to learn: no second ANALYZE
    # another process's keeper, which never analyzed anything, finds nothing stale either
    assert StatisticsKeeper(store).run() == []


def test_a_table_that_grew_past_four_times_its_analyzed_size_is_analyzed_again(
    fresh: tuple[str, Store, psycopg.Connection[Any]],
) -> None:
    _, store, raw = fresh
    queue = store.queues.put("emails", QueueSettings(), Settings()).queue
    schedule(store, queue, 4_000)
    raw.execute("ANALYZE tickler_event")  # as autovacuum would have, at this size
    _, pages_then = analyzed(raw, "tickler_event")
    keeper = StatisticsKeeper(store)
    schedule(store, queue, 6_000, start=4_000)  # 2.5 times as large: not yet
    assert keeper.run() == []
    schedule(store, queue, 10_000, start=10_000)  # 5 times as large
    assert keeper.run() == ["tickler_event"]
    rows, pages = analyzed(raw, "tickler_event")
    assert rows == pytest.approx(20_000, rel=0.05) and pages > GROWTH * pages_then


def claim_buffers(raw: psycopg.Connection[Any]) -> int:
    """Shared buffers one claim of 10 due events reads (EXPLAIN ANALYZE runs it: it claims them)."""
    params = {"queue": "emails", "worker": "w", "limit": 10, "lease_seconds": 30.0, "now": None, "flow": False}
    row = raw.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + driver_sql("claim_events"), params).fetchone()
    assert row is not None
    top = (row[0] if isinstance(row[0], list) else json.loads(row[0]))[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


def test_after_the_keeper_a_claim_no_longer_reads_every_open_event(
    fresh: tuple[str, Store, psycopg.Connection[Any]],
) -> None:
    """The reason for the keeper: 20,000 due events of a new database, claimed 10 at a time.
    Without statistics the planner believes each condition of the claim leaves one row and reads
    the queue's open events for each claim; with them it reads the first due entries."""
    _, store, raw = fresh
    queue = store.queues.put("emails", QueueSettings(), Settings()).queue
    schedule(store, queue, 20_000, delay_seconds=0)
    store.leases.claim(queue, worker="w", limit=50)  # events in flight at the head of the queue
    blind = claim_buffers(raw)
    assert StatisticsKeeper(store).run() == ["tickler_event"]
    informed = claim_buffers(raw)
    assert informed * 5 < blind, (informed, blind)
    assert informed < 1_000, informed


def test_a_running_dispatcher_gathers_the_statistics_of_a_burst(
    fresh: tuple[str, Store, psycopg.Connection[Any]],
) -> None:
    url, store, raw = fresh
    queue = store.queues.put("emails", QueueSettings(), Settings()).queue
    with recording_worker(url, "emails", lambda event: None, name="stats-worker"):
        schedule(store, queue, 5_000)
        wait_until(
            lambda: analyzed(raw, "tickler_event")[0] > 0,
            timeout=20,
            what=lambda: f"tickler_event still never analyzed: {analyzed(raw, 'tickler_event')}",
        )
