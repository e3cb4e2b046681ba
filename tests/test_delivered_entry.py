"""A delivery's timeline entry is its history row (migration 0072): an ack writes no timeline row,
and the entry everything reads (tickler_timeline_all, the key's timeline, the dashboard's
per-minute counts) is the one the ack used to write. With trace ids (SPEC §11) the ack still
writes the row, which holds the trace id history does not keep."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg

from tests.helpers import plan_nodes
from tests.previous_ack import ack_before_0072
from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.sql import driver_sql, file_queries
from tickler.scheduler.store import Store


def one(raw: psycopg.Connection[Any], sql: str, *params: Any) -> Any:
    found = raw.execute(sql, params).fetchone()
    assert found is not None
    return found[0]


def entries(raw: psycopg.Connection[Any], item_key: str) -> list[tuple[Any, ...]]:
    """The key's timeline rows as stored before 0072 wrote them: id, action, actor, details."""
    return raw.execute(
        "SELECT id, action, actor, details FROM tickler_timeline_all WHERE item_key = %s ORDER BY id", [item_key]
    ).fetchall()


def without_lease(details: dict[str, Any]) -> dict[str, Any]:
    """The details of a `delivered` row without the lease id, which differs between two leases."""
    return {name: value for name, value in details.items() if name != "lease_id"}


def test_an_ack_writes_no_timeline_row_and_its_entry_reads_as_the_one_it_used_to_write(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("entry_in_history", lease_seconds=30)
    store.events.schedule_batch(queue, [NewEvent("new", {}), NewEvent("old", {})], actor="app")
    now = one(raw, "SELECT now()")
    by_key = {lease.events[0].item_key: lease for lease in store.leases.claim(queue, worker="w1", limit=2, now=now)}
    rows_before = one(raw, "SELECT count(*) FROM tickler_timeline")

    done = now + timedelta(seconds=1)
    assert store.leases.ack([by_key["new"].lease_id], now=done) == {by_key["new"].lease_id: queue.name}
    assert one(raw, "SELECT count(*) FROM tickler_timeline") == rows_before  # no row written
    assert ack_before_0072(store.engine, [by_key["old"].lease_id], now=done) == [by_key["old"].lease_id]
    assert one(raw, "SELECT count(*) FROM tickler_timeline") == rows_before + 1  # the old ack's row

    [*_, new] = entries(raw, "new")
    [*_, old] = entries(raw, "old")
    assert new[1:3] == old[1:3] == ("delivered", "w1")
    assert new[3]["lease_id"] == by_key["new"].lease_id
    assert without_lease(new[3]) == without_lease(old[3]) == {"attempt": 1, "claim": {"ago": 1, "lease_seconds": 30}}
    # the entry's id is the history row's, drawn from the timeline's sequence: it sorts after the
    # key's earlier entries and before the ones written after it
    assert one(raw, "SELECT entry_id FROM tickler_event_history WHERE item_key = 'new'") == new[0]
    assert new[0] > entries(raw, "new")[0][0]
    store.events.schedule(queue, NewEvent("new", {}), actor="app")  # the key again, a new event
    assert [row[1] for row in entries(raw, "new")] == ["enqueued", "delivered", "enqueued"]

    # read through the API's path: the key's timeline is the same for both
    timelines = {key: store.events.timeline(queue.name, key) for key in ("new", "old")}
    assert [e.action for e in timelines["old"]] == ["enqueued", "claimed", "delivered"]
    assert [e.action for e in timelines["new"]] == ["enqueued", "claimed", "delivered", "enqueued"]
    for new_entry, old_entry in zip(timelines["new"], timelines["old"], strict=False):
        assert (new_entry.at, new_entry.actor) == (old_entry.at, old_entry.actor)


def test_with_trace_ids_the_ack_writes_its_row_and_history_holds_no_entry(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("entry_traced", lease_seconds=30)
    store.events.schedule(queue, NewEvent("k", {}), actor="app")
    [lease] = store.leases.claim(queue, worker="w1", limit=1)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert store.leases.ack([lease.lease_id], trace_ids={lease.lease_id: trace_id}) == {lease.lease_id: queue.name}
    [delivered] = [row for row in entries(raw, "k") if row[1] == "delivered"]
    assert delivered[3]["trace_id"] == trace_id
    assert one(raw, "SELECT entry_id FROM tickler_event_history WHERE item_key = 'k'") is None
    assert one(raw, "SELECT count(*) FROM tickler_timeline WHERE item_key = 'k' AND action = 'delivered'") == 1


def test_each_delivery_counts_once_in_the_minute_rollup_whichever_row_is_its_entry(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("entry_counted", lease_seconds=30)
    store.events.schedule_batch(queue, [NewEvent(f"k{i}", {}) for i in range(5)], actor="app")
    leases = store.leases.claim(queue, worker="w1", limit=5)
    store.leases.ack([lease.lease_id for lease in leases[:3]])  # entries in history
    store.leases.ack([leases[3].lease_id], trace_ids={leases[3].lease_id: "0af7651916cd43dd8448eb211c80319c"})
    ack_before_0072(store.engine, [leases[4].lease_id])  # an entry the previous release wrote
    assert one(raw, "SELECT sum(delivered) FROM tickler_minute_stat WHERE queue = %s", queue.name) == 5
    assert (
        one(raw, "SELECT count(*) FROM tickler_timeline_all WHERE queue = %s AND action = 'delivered'", queue.name) == 5
    )


def history_rows_read(raw: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> int:
    """Rows the named statement read from history (EXPLAIN ANALYZE: every scan of a history partition)."""
    ui_reads = file_queries("tickler.scheduler.store", "ui_reads.sql")
    text = ui_reads[name] if name in ui_reads else driver_sql(name)
    [[result]] = raw.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {text}", params).fetchall()
    return sum(
        int(node.get("Actual Rows", 0)) * int(node.get("Actual Loops", 1))
        for node in plan_nodes(result)
        if str(node.get("Relation Name", "")).startswith("tickler_event_history")
    )


def test_a_key_delivered_many_times_reads_its_newest_entries_not_all_of_them(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    """The key's latest event and a timeline page read history newest first, by its entry index:
    a few rows (one per partition at most), however many times the key was delivered."""
    queue = make_queue("entry_busy_key", lease_seconds=30)
    deliveries = 60
    for n in range(deliveries):
        store.events.schedule(queue, NewEvent("busy", {"n": n}), actor="app")
        [lease] = store.leases.claim(queue, worker="w1", limit=1)
        store.leases.ack([lease.lease_id])
    partitions = one(raw, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'tickler_event_history'::regclass")
    key = {"queue": queue.name, "item_key": "busy"}

    assert store.events.get(queue.name, "busy").data == {"n": deliveries - 1}
    latest = history_rows_read(raw, "get_latest_event", {**key, "now": None})
    page = history_rows_read(raw, "timeline_page", {**key, "before": None, "limit": 10})
    assert latest <= 1 + partitions, latest  # the newest entry per partition, then the event itself
    assert page <= 2 * 10 + partitions, page  # the page's ids, then the page's entries
    assert len(store.events.timeline(queue.name, "busy")) == 3 * deliveries
