"""The per-minute rollup behind the dashboard's charts (migration 0012): kept by the timeline's
statement trigger, a ring of 120 minutes per queue, read back as the last hour's series."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from tickler.scheduler.models import NewEvent, Queue
from tickler.scheduler.store import Store
from tickler.scheduler.store.dashboard import DashboardStore

NOW = datetime(2030, 6, 1, 12, 30, 20, tzinfo=UTC)


def _timeline(raw: psycopg.Connection[Any], queue: str, rows: list[tuple[datetime, str]], details: str = "{}") -> None:
    """One INSERT statement of timeline rows (the trigger runs once per statement)."""
    raw.execute(
        "INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, details) "
        "SELECT %s, 'k' || n, n, at, action, 'w', %s::jsonb FROM unnest(%s::timestamptz[], %s::text[]) "
        "WITH ORDINALITY AS r (at, action, n)",
        [queue, details, [at for at, _ in rows], [action for _, action in rows]],
    )


def test_deliveries_and_failed_attempts_land_in_their_minute(store: Store, make_queue: Callable[..., Queue]) -> None:
    queue = make_queue("emails", max_attempts=2)
    events = [NewEvent(item_key=f"k{i}", data={}) for i in range(5)]
    store.events.schedule_batch(queue, events, actor="svc", now=NOW - timedelta(minutes=10))
    leases = store.leases.claim(queue, worker="w", limit=5, now=NOW - timedelta(minutes=10))
    store.leases.ack([le.lease_id for le in leases[:3]], now=NOW - timedelta(minutes=10))
    for lease in leases[3:]:
        store.leases.nack(lease.lease_id, error="boom", retry_in_seconds=60, now=NOW - timedelta(minutes=10))
    again = store.leases.claim(queue, worker="w", limit=5, now=NOW)
    assert len(again) == 2
    for lease in again:  # the second failure ends them: dead, and counted as a failed attempt
        store.leases.nack(lease.lease_id, error="boom", now=NOW)

    [emails] = DashboardStore(store.engine).overview(["emails"], now=NOW)
    assert len(emails.delivered_per_minute) == 60
    assert emails.delivered_per_minute[-11] == 3  # ten minutes before the current one
    assert emails.failed_per_minute[-11] == 2
    assert emails.failed_per_minute[-1] == 2
    assert sum(emails.delivered_per_minute) == 3
    assert sum(emails.failed_per_minute) == 4
    assert emails.counts["dead"] == 2


def test_the_ring_keeps_the_newest_minute_and_an_hour_is_read(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    make_queue("emails")
    make_queue("billing")
    minute = NOW.replace(second=0)
    _timeline(raw, "emails", [(minute - timedelta(minutes=120), "delivered")] * 4)  # same ring slot
    _timeline(raw, "emails", [(minute, "delivered")] * 2 + [(minute, "lease_expired"), (minute, "claimed")])
    _timeline(raw, "emails", [(minute - timedelta(minutes=120), "delivered")])  # older: ignored
    _timeline(raw, "emails", [(minute - timedelta(minutes=60), "delivered")])  # outside the hour
    _timeline(raw, "billing", [(minute - timedelta(minutes=59), "failed")])
    # dead after lease expiry (no lease_id: the lease_expired row already counted that attempt)
    _timeline(raw, "billing", [(minute, "dead")], details='{"reason": "attempts exhausted"}')

    emails, billing = DashboardStore(store.engine).overview(None, now=NOW)[::-1]
    assert emails.name == "emails"
    assert emails.delivered_per_minute[-1] == 2
    assert emails.failed_per_minute[-1] == 1
    assert sum(emails.delivered_per_minute) == 2
    assert billing.failed_per_minute == (1,) + (0,) * 59
    rows = raw.execute("SELECT count(*) FROM tickler_minute_stat WHERE queue = 'emails'").fetchone()
    assert rows is not None and rows[0] == 2  # a ring position per minute seen, not a row per minute forever


def test_a_statement_spanning_hours_counts_only_the_newest_minute_per_ring_position(
    store: Store, make_queue: Callable[..., Queue], raw: psycopg.Connection[Any]
) -> None:
    """A bulk import of history writes many minutes that share ring positions in one statement:
    it must not fail ("ON CONFLICT DO UPDATE cannot affect row a second time")."""
    make_queue("emails")
    minute = NOW.replace(second=0)
    _timeline(raw, "emails", [(minute - timedelta(minutes=m), "delivered") for m in range(0, 600, 5)])
    [emails] = DashboardStore(store.engine).overview(["emails"], now=NOW)
    assert sum(emails.delivered_per_minute) == 12  # minutes 0, 5, ..., 55 ago
