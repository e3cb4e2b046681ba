"""The lease table (migration 0060): it always holds exactly the live leases of the event rows,
whatever statement changed them, and a claim rewrites the event row as a HOT update (no entry in
any index of the events)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg

from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.sql import driver_sql
from tickler.scheduler.store import Store


def leases_of_rows(raw: psycopg.Connection[Any]) -> set[tuple[Any, ...]]:
    return set(
        raw.execute(
            "SELECT lease_id, id, queue, group_key, fairness_key, lease_expires_on FROM tickler_event"
            " WHERE lease_id IS NOT NULL"
        ).fetchall()
    )


def lease_rows(raw: psycopg.Connection[Any]) -> set[tuple[Any, ...]]:
    return set(raw.execute("SELECT lease_id, event_id, queue, group_key, fairness_key, expires_on FROM tickler_lease"))


def test_the_lease_table_follows_every_change_of_a_lease(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails", lease_seconds=30, max_attempts=2)
    grouped = make_queue("digests", lease_seconds=30)
    store.events.schedule_batch(
        queue, [NewEvent(item_key=f"k{i}", data={}, fairness_key=f"t{i % 2}") for i in range(8)], actor="app"
    )
    store.events.schedule_batch(
        grouped, [NewEvent(item_key=f"g{i}", data={}, group_key=f"grp{i % 2}") for i in range(4)], actor="app"
    )
    steps: list[str] = []

    def check(step: str) -> None:
        steps.append(step)
        assert lease_rows(raw) == leases_of_rows(raw), step

    check("scheduled")
    leases = store.leases.claim(queue, worker="w", limit=6)
    assert len(leases) == 6
    check("claimed")
    group_leases = store.leases.claim(grouped, worker="w", limit=2)
    assert len(group_leases) == 2 and all(len(lease.events) == 2 for lease in group_leases)
    check("group claimed")
    assert len(lease_rows(raw)) == 10
    store.leases.extend(leases[0].lease_id, seconds=300)
    check("extended")
    store.leases.ack([leases[0].lease_id, group_leases[0].lease_id])
    check("acked")
    store.leases.nack(leases[1].lease_id, error="later")
    check("nacked")
    store.leases.nack(leases[2].lease_id, error="stop", dead=True)
    check("nacked dead")
    store.leases.release([leases[3].lease_id], actor="w")
    check("released")
    # the leases of 4 and 5 run out: the reaper ends them (one of them was its event's last attempt)
    later = leases[4].expires_at + timedelta(seconds=1)
    assert sum(store.leases.expire(queue="emails", now=later).values()) >= 2
    check("reaped")
    again = store.leases.claim(queue, worker="w2", limit=10)
    check("claimed again")
    store.leases.ack([lease.lease_id for lease in again] + [group_leases[1].lease_id])
    check("all acked")
    assert lease_rows(raw) == set()
    raw.execute("TRUNCATE tickler_event CASCADE")
    assert lease_rows(raw) == set()


def test_a_claim_is_a_hot_update(store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]) -> None:
    """Every claimed row is rewritten in place (HOT): the event's indexes get no entry; the lease
    gets its row and one entry in the lease table's primary key."""
    queue = make_queue("emails")
    store.events.schedule_batch(queue, [NewEvent(item_key=f"k{i}", data={}) for i in range(300)], actor="app")
    claim = driver_sql("claim_events")
    raw.execute("BEGIN")
    try:
        claimed = raw.execute(
            claim,
            {
                "queue": "emails",
                "worker": "w",
                "limit": 100,
                "lease_seconds": 30,
                "now": None,
                "flow": False,
                "fair": False,
            },
        ).fetchall()
        stats = raw.execute(
            "SELECT pg_stat_get_xact_tuples_updated('tickler_event'::regclass),"
            " pg_stat_get_xact_tuples_hot_updated('tickler_event'::regclass),"
            " pg_stat_get_xact_tuples_inserted('tickler_lease'::regclass)"
        ).fetchone()
    finally:
        raw.execute("ROLLBACK")
    assert len(claimed) == 100
    assert stats == (100, 100, 100)


def test_deleting_events_of_every_size_ends_exactly_their_lease_rows(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    """The DELETE trigger's two ways (migration 0069: a statement planned once for up to 64 leased
    rows, a join planned per statement above) end the lease rows of the deleted events and no
    other: acks of 1 to 150 leases, and plain deletes of some of a group lease's events."""
    queue = make_queue("emails", lease_seconds=30)
    grouped = make_queue("digests", lease_seconds=30)
    store.events.schedule_batch(queue, [NewEvent(item_key=f"k{i}", data={}) for i in range(400)], actor="app")
    store.events.schedule_batch(
        grouped, [NewEvent(item_key=f"g{i}", data={}, group_key=f"grp{i % 2}") for i in range(10)], actor="app"
    )
    leases = store.leases.claim(queue, worker="w", limit=400)
    group_leases = store.leases.claim(grouped, worker="w", limit=2)
    assert len(leases) == 400 and [len(lease.events) for lease in group_leases] == [5, 5]
    for size in (1, 10, 64, 65, 150):
        acked, leases = leases[:size], leases[size:]
        done = store.leases.ack([lease.lease_id for lease in acked])
        assert set(done) == {str(lease.lease_id) for lease in acked}, size
        assert lease_rows(raw) == leases_of_rows(raw), size
        assert len(lease_rows(raw)) == len(leases) + 10, size
    # plain SQL (another writer) deletes two of one group lease's five events: the lease goes on for
    # the other three
    members = [event.id for event in group_leases[0].events]
    raw.execute("DELETE FROM tickler_event WHERE id = ANY(%s)", [members[:2]])
    assert lease_rows(raw) == leases_of_rows(raw)
    assert {row[1] for row in lease_rows(raw) if str(row[0]) == group_leases[0].lease_id} == set(members[2:])


def test_an_ack_finds_its_lease_rows_by_the_lease_tables_key(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    """Among thousands of live leases, deleting ten leased events ends their lease rows through the
    lease table's primary key, without a scan of the table."""
    queue = make_queue("emails", lease_seconds=300)
    store.events.schedule_batch(queue, [NewEvent(item_key=f"k{i}", data={}) for i in range(3000)], actor="app")
    leases = store.leases.claim(queue, worker="w", limit=3000)
    raw.execute("ANALYZE tickler_lease")
    ids = [lease.events[0].id for lease in leases[:10]]
    raw.execute("BEGIN")
    try:
        raw.execute("DELETE FROM tickler_event WHERE id = ANY(%s)", [ids])
        scans = raw.execute(
            "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relid = 'tickler_lease'::regclass"
        ).fetchone()
        left = raw.execute("SELECT count(*) FROM tickler_lease WHERE event_id = ANY(%s)", [ids]).fetchone()
    finally:
        raw.execute("ROLLBACK")
    assert left == (0,)
    assert scans is not None and scans[0] == 0 and scans[1] >= 1


def test_the_group_probe_reads_the_grouped_leases_index(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    """tickler_groups_due() runs at every ungrouped claim: among thousands of live ungrouped leases
    it finds an expired group lease (and none where there is none) through the partial index of
    the grouped leases (migration 0070), without a scan of the lease table."""
    emails = make_queue("emails", lease_seconds=300)
    digests = make_queue("digests", lease_seconds=30)
    store.events.schedule_batch(emails, [NewEvent(item_key=f"k{i}", data={}) for i in range(3000)], actor="app")
    store.events.schedule_batch(
        digests, [NewEvent(item_key=f"g{i}", data={}, group_key=f"grp{i % 2}") for i in range(4)], actor="app"
    )
    assert len(store.leases.claim(emails, worker="w", limit=3000)) == 3000
    (group_lease, _) = store.leases.claim(digests, worker="w", limit=2)
    raw.execute("ANALYZE tickler_lease")
    later = group_lease.expires_at + timedelta(seconds=1)
    raw.execute("BEGIN")
    try:
        answers = raw.execute(
            "SELECT tickler_groups_due('emails', %(later)s, false), tickler_groups_due('digests', %(later)s, false),"
            " tickler_groups_due('digests', NULL, false)",
            {"later": later},
        ).fetchone()
        scans = raw.execute(
            "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = 'tickler_lease'::regclass"
        ).fetchone()
    finally:
        raw.execute("ROLLBACK")
    assert answers == (False, True, False)
    assert scans == (0,)
