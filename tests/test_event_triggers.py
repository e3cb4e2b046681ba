"""One statement trigger per operation on tickler_event (migration 0065): after every kind of
statement that changes the events -- the store's schedules, claims, finishes, the reaper, the
operations, and plain SQL that only another writer would run (a row inserted finished or leased,
a move between queues, a statement over several queues, a finish as an UPDATE) -- the counters
equal the rows counted, the lease table holds exactly the live leases of the rows, and no
finished event is left among the open ones."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg

from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import Store
from tickler.scheduler.store.operations import EventOperations
from tickler.scheduler.store.search import Matching


def kept_counts(raw: psycopg.Connection[Any]) -> dict[tuple[str, str], int]:
    rows = raw.execute("SELECT queue, state, sum(n)::bigint FROM tickler_queue_count GROUP BY 1, 2 HAVING sum(n) <> 0")
    return {(queue, state): int(n) for queue, state, n in rows}


def counted(raw: psycopg.Connection[Any]) -> dict[tuple[str, str], int]:
    rows = raw.execute("SELECT queue, coalesce(outcome, 'open'), count(*) FROM tickler_event_all GROUP BY 1, 2")
    return {(queue, state): int(n) for queue, state, n in rows}


def lease_rows(raw: psycopg.Connection[Any]) -> set[tuple[Any, ...]]:
    return set(raw.execute("SELECT lease_id, event_id, queue, group_key, fairness_key, expires_on FROM tickler_lease"))


def leases_of_rows(raw: psycopg.Connection[Any]) -> set[tuple[Any, ...]]:
    return set(
        raw.execute(
            "SELECT lease_id, id, queue, group_key, fairness_key, lease_expires_on FROM tickler_event"
            " WHERE lease_id IS NOT NULL AND dequeued_on IS NULL"
        )
    )


def test_the_events_have_one_statement_trigger_per_operation(raw: psycopg.Connection[Any]) -> None:
    triggers = raw.execute(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'tickler_event'::regclass AND NOT tgisinternal ORDER BY 1"
    ).fetchall()
    assert [t for (t,) in triggers] == [
        "tickler_event_deleted",
        "tickler_event_group_fairness",  # BEFORE ROW, grouped rows only (0045)
        "tickler_event_inserted",
        "tickler_event_updated",
        "tickler_keep_leases_truncated",
    ]


def test_every_statement_keeps_the_counters_and_the_leases(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    emails = make_queue("emails", lease_seconds=30, max_attempts=2)
    digests = make_queue("digests", lease_seconds=30)
    make_queue("other", lease_seconds=30)
    ops = EventOperations(store.events.engine)
    steps: list[str] = []

    def check(step: str) -> None:
        steps.append(step)
        assert kept_counts(raw) == counted(raw), step
        assert lease_rows(raw) == leases_of_rows(raw), step
        finished = raw.execute("SELECT count(*) FROM tickler_event WHERE dequeued_on IS NOT NULL").fetchone()
        assert finished == (0,), step

    store.events.schedule(emails, NewEvent(item_key="one", data={}), actor="app")
    check("schedule one")
    store.events.schedule_batch(
        emails, [NewEvent(item_key=f"k{i}", data={}, fairness_key=f"t{i % 2}") for i in range(10)], actor="app"
    )
    check("schedule batch")
    store.events.schedule_batch(
        digests, [NewEvent(item_key=f"g{i}", data={}, group_key=f"grp{i % 2}") for i in range(4)], actor="app"
    )
    check("schedule grouped")
    store.events.schedule(emails, NewEvent(item_key="one", data={"v": 2}), actor="app", on_conflict="replace")
    check("replace")
    store.events.schedule(emails, NewEvent(item_key="one", data={"v": 3}), actor="app", on_conflict="debounce")
    check("debounce")
    store.events.cancel("emails", "one", actor="app")
    check("cancel")
    leases = store.leases.claim(emails, worker="w", limit=8)
    assert len(leases) == 8
    check("claim")
    group_leases = store.leases.claim(digests, worker="w", limit=2)
    assert len(group_leases) == 2
    check("group claim")
    store.leases.extend(leases[0].lease_id, seconds=300)
    check("extend")
    store.leases.ack([leases[0].lease_id, group_leases[0].lease_id])
    check("ack")
    assert store.leases.ack_one(leases[5].lease_id) == "emails"
    check("ack one")
    store.leases.nack(leases[1].lease_id, error="later")
    check("nack")
    store.leases.nack(leases[2].lease_id, error="stop", dead=True)
    check("nack dead")
    store.leases.release([leases[3].lease_id], actor="w")
    check("release")
    later = leases[4].expires_at + timedelta(seconds=1)
    assert sum(store.leases.expire(queue="emails", now=later).values()) >= 1
    check("reaper")
    assert ops.retry("emails", leases[2].events[0].item_key, actor="ops").status == "pending"
    check("retry a dead event")
    assert store.events.cancel_matching("emails", Matching(item_key_prefix="k"), actor="ops") >= 1
    check("cancel matching")
    ops.retry_matching("emails", Matching(item_key_prefix="k"), actor="ops")
    check("retry matching")

    # statements of more than a few rows that had leases (planned for their own size, 0065)
    store.events.schedule_batch(emails, [NewEvent(item_key=f"bulk{i}", data={}) for i in range(12)], actor="app")
    bulk = store.leases.claim(emails, worker="w", limit=50)
    check("claim of many")
    extended = raw.execute(
        "UPDATE tickler_event SET lease_expires_on = lease_expires_on + interval '1 minute' WHERE lease_id IS NOT NULL"
    )
    assert extended.rowcount > 8
    check("many leases extended")
    store.leases.release([lease.lease_id for lease in bulk], actor="w")
    check("many leases released")
    assert not [row for row in lease_rows(raw) if row[2] == "emails"]
    bulk = store.leases.claim(emails, worker="w", limit=50)
    assert len(bulk) > 8
    store.leases.ack([lease.lease_id for lease in bulk])
    check("many leases acked")

    # Statements of other writers (plain SQL): a move of open and leased events to another
    # queue, one statement over several queues, a finish as an UPDATE (the previous release's
    # ack), rows inserted leased and finished, a delete of leased rows.
    store.events.schedule_batch(emails, [NewEvent(item_key=f"m{i}", data={}) for i in range(4)], actor="app")
    assert store.leases.claim(emails, worker="w", limit=20)
    check("claim before the move")
    raw.execute("UPDATE tickler_event SET queue = 'other' WHERE queue = 'emails' AND item_key LIKE 'm%'")
    check("moved to another queue")
    raw.execute(
        "UPDATE tickler_event SET lease_expires_on = lease_expires_on + interval '1 minute' WHERE lease_id IS NOT NULL"
    )
    check("extended across queues")
    raw.execute(
        "UPDATE tickler_event SET dequeued_on = now(), dequeued_by = 'w', outcome = 'delivered', version = version + 1"
        " WHERE queue = 'other' AND item_key IN ('m0', 'm1')"
    )
    check("finished by an UPDATE")
    raw.execute(
        "UPDATE tickler_event SET lease_id = NULL, lease_expires_on = NULL, claimed_on = NULL, claimed_by = NULL"
        " WHERE queue = 'other' AND item_key = 'm2'"
    )
    check("lease cleared by an UPDATE")
    raw.execute(
        "INSERT INTO tickler_event (queue, item_key, schedule_on, data, enqueued_on, enqueued_by, max_attempts,"
        " lease_id, lease_expires_on, claimed_on, claimed_by)"
        " VALUES ('other', 'leased', now(), '{}', now(), 'sql', 3, gen_random_uuid(), now() + interval '1 minute',"
        " now(), 'w'),"
        " ('emails', 'open', now(), '{}', now(), 'sql', 3, NULL, NULL, NULL, NULL)"
    )
    check("inserted leased")
    raw.execute(
        "INSERT INTO tickler_event (queue, item_key, schedule_on, data, enqueued_on, enqueued_by, max_attempts,"
        " dequeued_on, dequeued_by, outcome)"
        " VALUES ('other', 'done', now(), '{}', now(), 'sql', 3, now(), 'sql', 'cancelled'),"
        " ('emails', 'done', now(), '{}', now(), 'sql', 3, now(), 'sql', 'dead')"
    )
    check("inserted finished")
    raw.execute("DELETE FROM tickler_event WHERE queue = 'other' AND lease_id IS NOT NULL")
    check("deleted leased")
    raw.execute("UPDATE tickler_event SET data = data WHERE false")
    check("updated nothing")

    # a queue's deletion cancels and deletes its events
    store.leases.ack([lease.lease_id for lease in store.leases.claim(digests, worker="w", limit=10)])
    store.leases.ack([group_leases[1].lease_id])
    check("digests drained")
    store.queues.delete("digests", actor="ops", cancel_open=True)
    check("queue deleted")
    assert counted(raw)[("emails", "delivered")] >= 2 and counted(raw)[("other", "delivered")] == 2
    assert not [key for key in kept_counts(raw) if key[0] == "digests"]
    assert len(steps) == 33
