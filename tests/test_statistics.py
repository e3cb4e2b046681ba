"""The hot tables' planner statistics are gathered by the dispatchers when a table that was never
analyzed fills up, or grows past four times the rows its statistics were taken at
(scheduler/statistics.py): without them a claim's plan reads every open event."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests import pg
from tests.helpers_wait import wait_until
from tests.helpers_worker import recording_worker
from tickler.config import Settings
from tickler.scheduler.db import create_engine
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.sql import driver_sql
from tickler.scheduler.statistics import MIN_DEAD_LEASES, MIN_ROWS, StatisticsKeeper, periodic
from tickler.scheduler.store import QueueSettings, Store
from tickler.scheduler.store.statistics import WriterLook


@pytest.fixture
def fresh(admin_url: str) -> Iterator[tuple[str, Store, psycopg.Connection[Any]]]:
    """A database of its own, just migrated: its tables were never analyzed. Autovacuum is off
    for the hot tables, so that only the code under test analyzes them."""
    with pg.migrated_database(admin_url, "tickler_stats", pool_size=2) as (url, engine, raw):
        raw.execute("ALTER TABLE tickler_event SET (autovacuum_enabled = off)")
        raw.execute("ALTER TABLE tickler_lease SET (autovacuum_enabled = off)")
        yield url, Store(engine), raw


def schedule(url: str, queue: Queue, count: int, *, start: int = 0, delay_seconds: float = 3600) -> None:
    """Schedule `count` events on a connection of its own, closed at the end: a backend reports its
    inserts to the statistics views when it exits (an idle one, up to ten seconds later)."""
    engine = create_engine(url, pool_size=1)
    writer = Store(engine)
    writer.events.statistics_look.off()  # only the job under test analyzes
    try:
        for first in range(start, start + count, 5_000):
            writer.events.schedule_batch(
                queue,
                [
                    NewEvent(item_key=f"k{i}", data={}, delay_seconds=delay_seconds)
                    for i in range(first, min(first + 5_000, start + count))
                ],
                actor="load",
            )
    finally:
        engine.dispose()


def analyzed(raw: psycopg.Connection[Any], table: str) -> float:
    """The table's rows as its last ANALYZE (or VACUUM) counted them (-1: never)."""
    row = raw.execute("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)", [table]).fetchone()
    assert row is not None
    return float(row[0])


def counted(raw: psycopg.Connection[Any], rows: int) -> None:
    """Wait until the statistics views count `rows` live events (the writing backend reports its
    inserts within about a second of its commit): what the keeper looks at."""

    def live() -> int:
        row = raw.execute("SELECT n_live_tup FROM pg_stat_user_tables WHERE relname = 'tickler_event'").fetchone()
        return int(row[0]) if row else -1

    wait_until(lambda: live() == rows, what=lambda: f"{live()} live rows counted, not {rows}")


def test_a_table_never_analyzed_is_analyzed_once_it_holds_events(
    fresh: tuple[str, Store, psycopg.Connection[Any]],
) -> None:
    url, store, raw = fresh
    queue = store.queues.put("emails", QueueSettings(), Settings()).queue
    keeper = StatisticsKeeper(store)
    schedule(url, queue, MIN_ROWS - 1)
    counted(raw, MIN_ROWS - 1)
    assert keeper.run() == []  # a few open events: any plan reads little, left to autovacuum
    assert analyzed(raw, "tickler_event") < 0

    schedule(url, queue, 5_000, start=MIN_ROWS)
    counted(raw, MIN_ROWS - 1 + 5_000)
    assert keeper.run() == ["tickler_event"]
    assert analyzed(raw, "tickler_event") == pytest.approx(MIN_ROWS - 1 + 5_000, rel=0.05)
    assert keeper.run() == []  # nothing new to learn: no second ANALYZE
    # another process's keeper, which never analyzed anything, finds nothing stale either
    assert StatisticsKeeper(store).run() == []


def test_a_table_that_grew_past_four_times_its_analyzed_size_is_analyzed_again(
    fresh: tuple[str, Store, psycopg.Connection[Any]],
) -> None:
    url, store, raw = fresh
    queue = store.queues.put("emails", QueueSettings(), Settings()).queue
    schedule(url, queue, 4_000)
    counted(raw, 4_000)  # (an ANALYZE sets the count; inserts reported after it would add to it)
    raw.execute("ANALYZE tickler_event")  # as autovacuum would have, at this size
    keeper = StatisticsKeeper(store)
    schedule(url, queue, 6_000, start=4_000)  # 2.5 times as many: not yet
    counted(raw, 10_000)
    assert keeper.run() == []
    schedule(url, queue, 10_000, start=10_000)  # 5 times as many
    counted(raw, 20_000)
    assert keeper.run() == ["tickler_event"]
    assert analyzed(raw, "tickler_event") == pytest.approx(20_000, rel=0.05)


def test_an_insert_not_yet_committed_does_not_count(fresh: tuple[str, Store, psycopg.Connection[Any]]) -> None:
    """The table's file grows while a large insert is uncommitted: an ANALYZE then would sample
    none of its rows and record an empty table (the planner would size it at nothing until it
    grew four times more). The keeper waits for the committed rows."""
    _, store, raw = fresh
    store.queues.put("emails", QueueSettings(), Settings())
    keeper = StatisticsKeeper(store)
    events = json.dumps([{"ord": i, "item_key": f"k{i}", "delay_seconds": 3600} for i in range(5_000)])
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("SELECT count(*) FROM tickler_schedule('emails', CAST(:events AS jsonb), 'load', 'reject')"),
            {"events": events},
        )
        assert keeper.run() == []
    wait_until(lambda: keeper.run(), timeout=30, what="the keeper to analyze the committed rows")
    assert analyzed(raw, "tickler_event") == pytest.approx(5_000, rel=0.05)


def claim_buffers(raw: psycopg.Connection[Any]) -> int:
    """Shared buffers one claim of 10 due events reads (EXPLAIN ANALYZE runs it: it claims them)."""
    params = {
        "queue": "emails",
        "worker": "w",
        "limit": 10,
        "lease_seconds": 30.0,
        "now": None,
        "flow": False,
        "fair": False,
    }
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
    url, store, raw = fresh
    queue = store.queues.put("emails", QueueSettings(), Settings()).queue
    schedule(url, queue, 20_000, delay_seconds=0)
    store.leases.claim(queue, worker="w", limit=50)  # events in flight at the head of the queue
    blind = claim_buffers(raw)
    counted(raw, 20_000)
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
        schedule(url, queue, 5_000)
        wait_until(
            lambda: analyzed(raw, "tickler_event") > 0,
            timeout=20,
            what=lambda: f"tickler_event still never analyzed: {analyzed(raw, 'tickler_event')}",
        )


def lease_table(raw: psycopg.Connection[Any]) -> tuple[int, int]:
    """The lease table's pages, and its dead rows as the statistics views count them."""
    raw.execute("SELECT pg_stat_clear_snapshot()")
    row = raw.execute(
        "SELECT pg_relation_size('tickler_lease') / current_setting('block_size')::int, n_dead_tup"
        " FROM pg_stat_user_tables WHERE relname = 'tickler_lease'"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_the_lease_table_is_vacuumed_once_its_dead_rows_outnumber_its_live_ones(
    fresh: tuple[str, Store, psycopg.Connection[Any]],
) -> None:
    """Every claim reads the lease table whole; each of its rows dies when its lease ends. Without
    a VACUUM between autovacuum's visits, new leases go to new pages and a drain's claims read
    ever more pages of dead rows. The keeper vacuums it from MIN_DEAD_LEASES dead rows on, and
    the next leases reuse the space."""
    url, store, raw = fresh
    queue = store.queues.put("emails", QueueSettings(), Settings()).queue
    schedule(url, queue, 5 * MIN_DEAD_LEASES, delay_seconds=0)
    keeper = StatisticsKeeper(store)

    def drain(events: int) -> None:
        for _ in range(events // 100):
            leases = store.leases.claim(queue, worker="w", limit=100)
            assert len(store.leases.ack([lease.lease_id for lease in leases])) == len(leases) == 100
        store.engine.dispose()  # its backends report their deletes as they exit (an idle one: in 10 s)

    drain(MIN_DEAD_LEASES // 2)
    wait_until(lambda: lease_table(raw)[1] >= MIN_DEAD_LEASES // 2, what=lambda: f"dead rows: {lease_table(raw)}")
    assert keeper.sweep() == []  # fewer than MIN_DEAD_LEASES: left to autovacuum
    drain(MIN_DEAD_LEASES)
    wait_until(lambda: lease_table(raw)[1] >= MIN_DEAD_LEASES, what=lambda: f"dead rows: {lease_table(raw)}")
    pages_before, _ = lease_table(raw)
    assert keeper.sweep() == ["tickler_lease"]
    assert lease_table(raw)[1] == 0
    drain(MIN_DEAD_LEASES)  # as many leases again: into the space the VACUUM freed
    assert lease_table(raw)[0] <= pages_before
    # with more live leases than dead ones, a VACUUM would free little: none
    for _ in range(3):
        assert len(store.leases.claim(queue, worker="w", limit=MIN_DEAD_LEASES // 2)) == MIN_DEAD_LEASES // 2
    store.engine.dispose()

    def live_leases() -> int:
        raw.execute("SELECT pg_stat_clear_snapshot()")
        row = raw.execute("SELECT n_live_tup FROM pg_stat_user_tables WHERE relname = 'tickler_lease'").fetchone()
        return int(row[0]) if row else -1

    wait_until(lambda: live_leases() == 3 * MIN_DEAD_LEASES // 2, what=lambda: f"live leases: {live_leases()}")
    assert lease_table(raw)[1] >= MIN_DEAD_LEASES
    assert keeper.sweep() == []


def test_a_look_that_finds_the_previous_one_at_work_returns_at_once() -> None:
    """The job runs every second and may take longer (an ANALYZE on a busy machine): the
    dispatcher lets two runs overlap, and the second returns without looking."""
    entered, release = threading.Event(), threading.Event()
    looks: list[str] = []

    class SlowStatistics:  # the store's statistics, its first look held until released
        def look(self, **_: Any) -> list[Any]:
            looks.append("look")
            if len(looks) == 1:
                entered.set()
                assert release.wait(10)
            return []

    run = periodic(SimpleNamespace(statistics=SlowStatistics()))  # type: ignore[arg-type]
    first = threading.Thread(target=run)
    first.start()
    assert entered.wait(10)
    run()  # the first look is still at work: returns at once
    assert looks == ["look"]
    release.set()
    first.join(10)
    assert looks == ["look", "look"]  # the first run: statistics, then dead rows
    run()
    assert looks == ["look"] * 4


def test_a_process_that_only_writes_analyzes_what_it_wrote(
    fresh: tuple[str, Store, psycopg.Connection[Any]],
) -> None:
    """An API process, or a program scheduling batches before any worker runs, has no dispatcher
    and its statistics job: its writes look (WriterLook), or a batch's probe of its keys may read
    the queue's open events for each key."""
    _, store, raw = fresh
    queue = store.queues.put("emails", QueueSettings(), Settings()).queue
    store.events.statistics_look = WriterLook(store.statistics, every=0.0)
    batch = [NewEvent(item_key=f"k{i}", data={}, delay_seconds=3600) for i in range(5_000)]
    store.events.schedule_batch(queue, batch, actor="load")
    counted(raw, 5_000)  # what a look reads: the statistics views, once the writer reported
    store.events.schedule_batch(queue, [NewEvent(item_key="one-more", data={})], actor="load")
    assert analyzed(raw, "tickler_event") == pytest.approx(5_001, rel=0.05)
