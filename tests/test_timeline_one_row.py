"""One timeline row per delivery attempt (migration 0016): the claim writes none, the row that ends
the lease carries it, and the timeline reads the same as when each claim had its own row."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from tickler.scheduler.models import Lease, NewEvent, Queue, TimelineEntry
from tickler.scheduler.store import Store


def db_now(raw: psycopg.Connection[Any]) -> Any:
    return raw.execute("SELECT now()").fetchone()[0]  # type: ignore[index]


def rows(raw: psycopg.Connection[Any], item_key: str) -> list[str]:
    """The key's stored timeline rows, by action."""
    return [
        r[0] for r in raw.execute("SELECT action FROM tickler_timeline_all WHERE item_key = %s ORDER BY id", [item_key])
    ]


def ack(store: Store, lease: Lease, now: Any) -> None:
    store.leases.ack([lease.lease_id], now=now + timedelta(seconds=1))


def fail(store: Store, lease: Lease, now: Any) -> None:
    store.leases.nack(lease.lease_id, error="HTTP 500", retry_in_seconds=60, now=now + timedelta(seconds=1))


def die(store: Store, lease: Lease, now: Any) -> None:
    store.leases.nack(lease.lease_id, error="HTTP 410", dead=True, now=now + timedelta(seconds=1))


def release(store: Store, lease: Lease, now: Any) -> None:
    assert store.leases.release([lease.lease_id], actor="w-stopping", now=now + timedelta(seconds=1)) == 1


def expire(store: Store, lease: Lease, now: Any) -> None:
    assert store.leases.expire(now=now + timedelta(seconds=31)) == {"emails": 1}


def extend_then_ack(store: Store, lease: Lease, now: Any) -> None:
    store.leases.extend(lease.lease_id, seconds=120, now=now + timedelta(seconds=20))
    store.leases.ack([lease.lease_id], now=now + timedelta(seconds=100))


ENDINGS = {
    "delivered": ack,
    "failed": fail,
    "dead": die,
    "released": release,
    "lease_expired": expire,
    "extended, delivered": extend_then_ack,
}


@pytest.mark.parametrize("grouped", [False, True], ids=["ungrouped", "group claim"])
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_the_claimed_entry_reads_the_same_while_leased_and_after_the_lease_ends(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any], ending: str, grouped: bool
) -> None:
    queue = make_queue("emails", lease_seconds=30)
    group = "ana" if grouped else None
    store.events.schedule_batch(queue, [NewEvent(item_key="k", data={}, group_key=group)], actor="svc")
    now = db_now(raw)
    [lease] = store.leases.claim(queue, worker="svc/w1", limit=1, now=now)
    leased = store.events.timeline("emails", "k")
    assert [e.action for e in leased] == ["enqueued", "claimed"]
    claimed = leased[-1]
    assert (claimed.at, claimed.actor, claimed.details["lease_id"]) == (now, "svc/w1", lease.lease_id)
    assert datetime.fromisoformat(claimed.details["lease_expires_at"]) == now + timedelta(seconds=30)
    assert ("group_key" in claimed.details) is grouped
    assert rows(raw, "k") == ["enqueued"]  # the claim wrote no row

    ENDINGS[ending](store, lease, now)

    ended = store.events.timeline("emails", "k")
    assert ended[:2] == leased  # the same claimed entry, to the microsecond and the key
    assert ended[2].action == ending.split(", ")[-1]
    assert len(rows(raw, "k")) == len(ended) - 1  # its claim rides in the row that ended it


def test_a_retried_event_shows_each_attempt_with_its_own_schedule(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails", lease_seconds=30)
    store.events.schedule_batch(queue, [NewEvent(item_key="k", data={})], actor="svc")
    now = db_now(raw)
    [first] = store.leases.claim(queue, worker="w1", limit=1, now=now)
    first_claim = store.events.timeline("emails", "k")[-1]
    store.leases.nack(first.lease_id, error="HTTP 500", retry_in_seconds=60, now=now + timedelta(seconds=1))
    [second] = store.leases.claim(queue, worker="w2", limit=1, now=now + timedelta(seconds=61))
    second_claim = store.events.timeline("emails", "k")[-1]
    store.leases.ack([second.lease_id], now=now + timedelta(seconds=62))
    entries = store.events.timeline("emails", "k")
    assert [e.action for e in entries] == ["enqueued", "claimed", "failed", "claimed", "delivered"]
    assert entries[1] == first_claim and entries[3] == second_claim
    assert (entries[1].details["attempt"], entries[3].details["attempt"]) == (1, 2)
    assert entries[1].schedule_on != entries[2].schedule_on == entries[3].schedule_on  # the retry moved it
    assert rows(raw, "k") == ["enqueued", "failed", "delivered"]


def test_a_lease_taken_before_the_upgrade_keeps_its_one_claimed_entry(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    """A lease claimed before 0016 has its own `claimed` row and no claimed_expires_on: neither the
    timeline nor its finish add another one."""
    queue = make_queue("emails", lease_seconds=30)
    store.events.schedule_batch(queue, [NewEvent(item_key="k", data={})], actor="svc")
    [lease] = store.leases.claim(queue, worker="w1", limit=1)
    raw.execute(  # what the claim wrote before 0016
        """WITH old AS (UPDATE tickler_event SET claimed_expires_on = NULL WHERE item_key = 'k' RETURNING *)
           INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
           SELECT queue, item_key, id, claimed_on, 'claimed', claimed_by, schedule_on,
                  jsonb_build_object('lease_id', lease_id, 'attempt', redeliver_count + 1,
                                     'lease_expires_at', lease_expires_on)
           FROM old"""
    )
    assert [e.action for e in store.events.timeline("emails", "k")] == ["enqueued", "claimed"]
    store.leases.ack([lease.lease_id])
    entries: list[TimelineEntry] = store.events.timeline("emails", "k")
    assert [e.action for e in entries] == ["enqueued", "claimed", "delivered"]
    assert "claim" not in entries[2].details
    assert rows(raw, "k") == ["enqueued", "claimed", "delivered"]


def test_deleting_a_queue_under_a_lease_keeps_its_claimed_entry(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    queue = make_queue("emails", lease_seconds=30)
    store.events.schedule_batch(queue, [NewEvent(item_key="k", data={})], actor="svc")
    store.leases.claim(queue, worker="w1", limit=1)
    claimed = store.events.timeline("emails", "k")[-1]
    store.queues.delete("emails", actor="admin", cancel_open=True)
    entries = [
        e for e in raw.execute("SELECT action, at FROM tickler_timeline_entry WHERE item_key = 'k' ORDER BY id, step")
    ]
    assert entries == [("enqueued", entries[0][1]), ("claimed", claimed.at), ("cancelled", entries[2][1])]
